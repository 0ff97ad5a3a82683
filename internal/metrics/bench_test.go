package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"testing"

	"github.com/deptrace/deptrace/tracer"
)

// flows makes n distinct outbound dependencies (and their inbound ends).
func benchFlows(n int) []tracer.Flow {
	out := make([]tracer.Flow, 0, n)
	for i := range n {
		f := outbound(uint32(i), "10.0.1.9", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), uint16(1000+i%100),
			tracer.Counters{Connections: 3, BytesSent: 300, BytesReceived: 900, ConnectLatencyCount: 3, ConnectLatencySumUs: 450})
		if i%2 == 1 {
			f.Direction, f.Comm = tracer.Inbound, fmt.Sprintf("svc%d", i%1000)
		}
		out = append(out, f)
	}
	return out
}

// One drain's worth of flows added to the series (per flow: ns/op / N).
func BenchmarkObserveInterval(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("flows=%d", n), func(b *testing.B) {
			m := New(Options{})
			iv := tracer.Interval{Flows: benchFlows(n)}
			b.ReportAllocs()
			for b.Loop() {
				m.ObserveInterval(iv, hostOf, 0)
			}
		})
	}
}

// One Prometheus scrape (text format) with this many dependency series.
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("series=%d", n), func(b *testing.B) {
			m := New(Options{})
			m.ObserveInterval(tracer.Interval{Flows: benchFlows(n)}, hostOf, 0)
			h := m.Handler()
			var size int
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
				size = rec.Body.Len()
				_, _ = io.Discard.Write(rec.Body.Bytes())
			}
			b.ReportMetric(float64(size), "bytes/scrape")
		})
	}
}
