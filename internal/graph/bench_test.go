package graph

import (
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// benchGraph is the store benchmarks' graph: 2,500 hosts, 10,000 nodes,
// 50,000 edges (57,500 flows, one row each).
func benchGraph() ([]store.Observation, []store.Host) {
	addr := func(h int) string { return fmt.Sprintf("10.%d.%d.1", h/256, h%256) }
	var hs []store.Host
	for h := 0; h < 2500; h++ {
		hs = append(hs, store.Host{ID: fmt.Sprintf("h%d", h), Addrs: []string{addr(h)}})
	}
	ports := []uint16{80, 5432, 6379}
	procs := []string{"nginx", "postgres", "redis-server"}
	var obs []store.Observation
	at := time.Now()
	for h := 0; h < 2500; h++ {
		for k := 0; k < 20; k++ {
			peer := (h + 1 + k*97) % 2500
			obs = append(obs, store.Observation{HostID: fmt.Sprintf("h%d", h), Direction: "outbound", Proto: "tcp", LocalAddr: addr(h), RemoteAddr: addr(peer), Port: ports[k%3], Comm: "app", Counters: tracer.Counters{Connections: 5}, FirstSeen: at, LastSeen: at})
			if k < 3 {
				obs = append(obs, store.Observation{HostID: fmt.Sprintf("h%d", peer), Direction: "inbound", Proto: "tcp", LocalAddr: addr(peer), RemoteAddr: addr(h), Port: ports[k%3], Comm: procs[k%3], Counters: tracer.Counters{Connections: 5}, FirstSeen: at, LastSeen: at})
			}
		}
	}
	return obs, hs
}

// BenchmarkBuild times the Go join alone on benchGraph.
func BenchmarkBuild(b *testing.B) {
	obs, hs := benchGraph()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Build(obs, hs, nil)
	}
}

// BenchmarkWriteJSON times writing benchGraph's graph as JSON: indented
// (graph --format json), compact (/api/graph), and through encoding/json
// for comparison.
func BenchmarkWriteJSON(b *testing.B) {
	obs, hs := benchGraph()
	g := Build(obs, hs, nil)
	for _, c := range []struct {
		name  string
		write func(io.Writer) error
	}{
		{"indented", func(w io.Writer) error { return Write(w, g, "json") }},
		{"compact", func(w io.Writer) error { return WriteCompactJSON(w, g) }},
		{"encoding-json-indented", func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(g)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var n countWriter
			for i := 0; i < b.N; i++ {
				n = 0
				if err := c.write(&n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/1e6, "MB")
		})
	}
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }
