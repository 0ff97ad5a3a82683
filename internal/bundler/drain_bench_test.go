package bundler

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/testnet"
)

// What a drain costs on a busy host: 200,000 TIME_WAIT sockets (a web
// server's usual backlog) and 100 network namespaces, with live
// connections to harvest. The harvest walks deptrace's own socket storage;
// the alternative it replaced, an iter/tcp walk per namespace, walks the
// host's whole TCP table once per namespace. Both are measured here:
//
//	go test -v -run '^$' -bench DrainOnABusyHost -benchtime 5x ./internal/bundler
//
// TIME_WAIT lasts 60 s: the sockets are made in at most 50 s, and the
// measurements must end soon after (the log shows how many were present).
func BenchmarkDrainOnABusyHost(b *testing.B) {
	testnet.RequireRoot(b)
	nw := testnet.New(b, 100)
	// The root namespace keeps at most tcp_max_tw_buckets TIME_WAIT sockets
	// (131,072 here by default): room for 200,000 during the benchmark.
	// Loopback connects reuse TIME_WAIT ports by default (tcp_tw_reuse=2):
	// off, so that every connection leaves one.
	for file, v := range map[string]string{"tcp_max_tw_buckets": "262144", "tcp_tw_reuse": "0"} {
		path := "/proc/sys/net/ipv4/" + file
		if old, err := os.ReadFile(path); err == nil {
			defer func() { _ = os.WriteFile(path, old, 0o644) }() // best-effort restore of the sysctl
		}
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	tw := makeTimeWait(b, 200_000)
	bu, err := Load(Config{FlowMapSize: 65536, PortMapSize: 16384})
	if err != nil {
		b.Fatal(err)
	}
	defer bu.Close()
	if _, err := bu.Seed(); err != nil {
		b.Fatal(err)
	}
	const live = 200
	closeLive := liveConnections(b, live)
	defer closeLive()
	b.Logf("TIME_WAIT sockets: %d (made %d); namespaces: %d; live tagged connections: %d", timeWaitNow(), tw, len(nw.Hosts)+2, live)

	b.Run("harvest-and-drain", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, _, err := bu.Drain(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Logf("TIME_WAIT sockets before the walk: %d", timeWaitNow())
	b.Run("iter-tcp-walk-every-namespace", func(b *testing.B) {
		all, err := netns.List()
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < b.N; i++ {
			for _, ns := range all {
				if err := netns.Do(ns.Path, func() error {
					_, err := readIter[bundlerListenRecord](bu.iters["seed_listeners"])
					return err
				}); err != nil && !errors.Is(err, os.ErrNotExist) { // other tests' namespaces come and go
					b.Fatal(err)
				}
			}
		}
	})
	b.Logf("TIME_WAIT sockets at the end: %d", timeWaitNow())
}

// makeTimeWait leaves about n sockets in TIME_WAIT on loopback: clients
// close first, so each connection's client end waits there for 60 s.
func makeTimeWait(b *testing.B, n int) int {
	const ports = 12 // 28,000 ephemeral ports per destination port
	var lns []net.Listener
	for p := 0; p < ports; p++ {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { _, _ = c.Read(make([]byte, 1)); c.Close() }()
			}
		}()
	}
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	made := 0
	deadline := time.Now().Add(50 * time.Second) // TIME_WAIT lasts 60 s
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n && time.Now().Before(deadline); i += 8 {
				c, err := net.Dial("tcp4", lns[i%ports].Addr().String())
				if err != nil {
					continue
				}
				c.Close()
				mu.Lock()
				made++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	return made
}

func timeWaitNow() int {
	data, _ := os.ReadFile("/proc/net/sockstat")
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "TCP: "); ok {
			f := strings.Fields(rest)
			for i := 0; i+1 < len(f); i += 2 {
				if f[i] == "tw" {
					var n int
					_, _ = fmt.Sscan(f[i+1], &n) // not a number: 0 time-wait sockets
					return n
				}
			}
		}
	}
	return -1
}

// liveConnections opens n connections that stay up, one byte each way
// every drain's worth of time, so that the harvest has work.
func liveConnections(b *testing.B, n int) func() {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 64)
				for {
					k, err := c.Read(buf)
					if err != nil {
						return
					}
					_, _ = c.Write(buf[:k])
				}
			}()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		_, _ = c.Write([]byte("ping"))
		_, _ = c.Read(make([]byte, 4))
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			c.Close()
		}
		ln.Close()
	}
}
