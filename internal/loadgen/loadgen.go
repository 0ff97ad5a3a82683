// Package loadgen is deptrace's TCP/UDP echo load generator, in the spirit
// of the published evaluation's "connperf": closed-loop clients that either
// open a new connection per round trip (short-lived) or keep connections
// open (persistent), against an echo server.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Workloads.
const (
	TCPShort      = "tcp-short"      // a new connection per round trip
	TCPPersistent = "tcp-persistent" // Concurrency connections held open
	UDP           = "udp"            // datagram round trips
)

// Workloads lists the valid Config.Workload values.
var Workloads = []string{TCPShort, TCPPersistent, UDP}

// Config is one load run.
type Config struct {
	Workload    string
	Addr        string // server host:port
	Concurrency int    // parallel clients (connections for tcp-persistent)
	MsgSize     int    // bytes per request and per response
	Duration    time.Duration
}

// Validate names the first bad field and its allowed values.
func (c Config) Validate() error {
	if !slices.Contains(Workloads, c.Workload) {
		return fmt.Errorf("invalid workload %q: allowed %v", c.Workload, Workloads)
	}
	if c.Concurrency < 1 || c.Concurrency > 10000 {
		return fmt.Errorf("invalid concurrency %d: allowed 1 to 10000", c.Concurrency)
	}
	if c.MsgSize < 1 || c.MsgSize > 65000 {
		return fmt.Errorf("invalid message size %d: allowed 1 to 65000", c.MsgSize)
	}
	if c.Duration <= 0 || c.Duration > 24*time.Hour {
		return fmt.Errorf("invalid duration %s: allowed above 0 up to 24h", c.Duration)
	}
	return nil
}

// Result is what a run achieved.
type Result struct {
	Workload   string        `json:"workload"`
	RoundTrips uint64        `json:"round_trips"`
	Errors     uint64        `json:"errors"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	Rate       float64       `json:"rate_per_s"`
	P50        time.Duration `json:"p50_ns"`
	P90        time.Duration `json:"p90_ns"`
	P99        time.Duration `json:"p99_ns"`
	// CPU is the load process's user+system CPU time (filled by whoever
	// ran it as a process).
	CPU time.Duration `json:"cpu_ns,omitempty"`
}

// CPUPerRoundTrip is the load's own CPU cost of one round trip.
func (r Result) CPUPerRoundTrip() time.Duration {
	if r.RoundTrips == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.RoundTrips)
}

// Serve runs a TCP and a UDP echo server on addr until ctx is done. It
// returns once both sockets listen, with the bound address.
func Serve(ctx context.Context, addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen tcp %s: %w", addr, err)
	}
	pc, err := net.ListenPacket("udp", ln.Addr().String())
	if err != nil {
		ln.Close()
		return "", fmt.Errorf("listen udp %s: %w", ln.Addr(), err)
	}
	go func() { <-ctx.Done(); ln.Close(); pc.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go echoConn(c)
		}
	}()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return ln.Addr().String(), nil
}

// echoConn copies with read/write rather than io.Copy, which would splice.
func echoConn(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 65536)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

// Run drives the load until cfg.Duration passes or ctx is done.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var trips, errs atomic.Uint64
	lat := make([][]time.Duration, cfg.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < cfg.Concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			req := make([]byte, cfg.MsgSize)
			resp := make([]byte, cfg.MsgSize)
			var conn net.Conn
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for ctx.Err() == nil {
				t0 := time.Now()
				err := func() error {
					if conn == nil {
						network := "tcp"
						if cfg.Workload == UDP {
							network = "udp"
						}
						c, err := net.DialTimeout(network, cfg.Addr, 5*time.Second)
						if err != nil {
							return err
						}
						conn = c
					}
					conn.SetDeadline(time.Now().Add(5 * time.Second))
					if _, err := conn.Write(req); err != nil {
						return err
					}
					if cfg.Workload == UDP {
						_, err := conn.Read(resp)
						return err
					}
					_, err := io.ReadFull(conn, resp)
					return err
				}()
				if cfg.Workload == TCPShort || err != nil {
					if conn != nil {
						conn.Close()
						conn = nil
					}
				}
				if err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				trips.Add(1)
				if len(lat[w]) < 1<<20 {
					lat[w] = append(lat[w], time.Since(t0))
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := Result{Workload: cfg.Workload, RoundTrips: trips.Load(), Errors: errs.Load(), Elapsed: elapsed,
		Rate: float64(trips.Load()) / elapsed.Seconds()}
	if len(all) > 0 {
		r.P50, r.P90, r.P99 = pct(all, 50), pct(all, 90), pct(all, 99)
	}
	if r.RoundTrips == 0 {
		return r, errors.New("no round trip completed")
	}
	return r, nil
}

func pct(sorted []time.Duration, p int) time.Duration {
	return sorted[(len(sorted)-1)*p/100]
}
