package graph

import (
	"fmt"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// BenchmarkBuild times the Go join alone on the store benchmarks' graph:
// 2,500 hosts, 10,000 nodes, 50,000 edges (57,500 flows, one row each).
func BenchmarkBuild(b *testing.B) {
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
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		Build(obs, hs, nil)
	}
}
