// Package loadgen is deptrace's TCP/UDP echo load generator, in the spirit
// of the published evaluation's "connperf": clients that open a new
// connection per round trip (short-lived), keep connections open
// (persistent), or exchange datagrams (UDP), against echo servers, either as
// fast as they go or paced to a target rate (open loop: each start goes to
// whichever client is free, so one slow round trip does not hold the rate
// back). Clients can spread their source addresses over many loopback
// addresses and servers listen on many ports, so one machine can emulate
// many hosts and services. The load keeps
// its own ground truth: every (client, server, port, protocol) edge that
// completed a round trip.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
	Workload string
	// Addrs are the servers (host:port); round trips rotate over them.
	Addrs []string
	// Sources are client source addresses, one per emulated client host;
	// empty lets the kernel choose.
	Sources []netip.Addr
	// Concurrency is the number of parallel clients (tcp-short, udp) or of
	// connections held open (tcp-persistent): with a Rate, the most round
	// trips in flight at once. A paced load needs Rate × mean latency of
	// them (Little's law), with room for latency spikes.
	Concurrency int
	// Rate is the target round trips per second over all clients (for
	// tcp-short, new connections per second); 0 runs as fast as possible.
	Rate     float64
	MsgSize  int
	Duration time.Duration
}

// Validate names the first bad field and its allowed values.
func (c Config) Validate() error {
	if !slices.Contains(Workloads, c.Workload) {
		return fmt.Errorf("invalid workload %q: allowed %s", c.Workload, strings.Join(Workloads, ", "))
	}
	if c.Concurrency < 1 || c.Concurrency > 10000 {
		return fmt.Errorf("invalid concurrency %d: allowed 1 to 10000", c.Concurrency)
	}
	if c.MsgSize < 1 || c.MsgSize > 65000 {
		return fmt.Errorf("invalid msg-size %d: allowed 1 to 65000", c.MsgSize)
	}
	if c.Duration <= 0 || c.Duration > 24*time.Hour {
		return fmt.Errorf("invalid duration %s: allowed above 0 up to 24h", c.Duration)
	}
	if c.Rate < 0 || c.Rate > 10_000_000 {
		return fmt.Errorf("invalid rate %g: allowed 0 (as fast as possible) to 10000000", c.Rate)
	}
	if len(c.Addrs) == 0 {
		return errors.New("invalid addrs: at least one server address is needed")
	}
	return nil
}

// Edge is one client-to-server dependency the load really exercised.
type Edge struct {
	Client     string `json:"client"` // client address ("" when the kernel chose)
	Server     string `json:"server"` // server address
	Port       uint16 `json:"port"`
	Proto      string `json:"proto"`
	RoundTrips uint64 `json:"round_trips"`
}

// Result is what a run achieved.
type Result struct {
	Workload   string        `json:"workload"`
	TargetRate float64       `json:"target_rate_per_s"` // 0: as fast as possible
	RoundTrips uint64        `json:"round_trips"`
	Errors     uint64        `json:"errors"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	Rate       float64       `json:"rate_per_s"`
	// Reached is false when a target rate was set and the load fell more
	// than 5 % short of it.
	Reached bool `json:"reached"`
	// Missed counts paced starts dropped because they fell more than
	// 100 ms behind (every client was busy, or the load got no CPU).
	Missed uint64 `json:"missed_starts"`
	// Clients is the number of clients: the most round trips in flight.
	Clients int `json:"clients"`
	// FirstError is the first failed round trip's error, if any.
	FirstError string        `json:"first_error,omitempty"`
	P50        time.Duration `json:"p50_ns"`
	P90        time.Duration `json:"p90_ns"`
	P99        time.Duration `json:"p99_ns"`
	Max        time.Duration `json:"max_ns"`
	Mean       time.Duration `json:"mean_ns"`
	// CPU is the load process's user+system CPU time (filled by whoever
	// ran it as a process).
	CPU   time.Duration `json:"cpu_ns,omitempty"`
	Edges []Edge        `json:"edges"`
}

// CPUPerRoundTrip is the load's own CPU cost of one round trip.
func (r Result) CPUPerRoundTrip() time.Duration {
	if r.RoundTrips == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.RoundTrips)
}

// Serve runs a TCP and a UDP echo server on each of n consecutive ports
// from addr's port (port 0 with n == 1 picks a free one) until ctx is done.
// It returns the bound addresses once all listen.
func Serve(ctx context.Context, addr string, n int) ([]string, error) {
	if n < 1 || n > 20000 {
		return nil, fmt.Errorf("invalid ports %d: allowed 1 to 20000", n)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("invalid serve address %q: want ip:port", addr)
	}
	if n > 1 && (ap.Port() == 0 || int(ap.Port())+n-1 > 65535) {
		return nil, fmt.Errorf("invalid serve address %q for %d ports: give a first port with room for all", addr, n)
	}
	var out []string
	for i := 0; i < n; i++ {
		a := netip.AddrPortFrom(ap.Addr(), ap.Port()+uint16(i))
		if ap.Port() == 0 {
			a = ap
		}
		bound, err := serveOne(ctx, a.String())
		if err != nil {
			return nil, err
		}
		out = append(out, bound)
	}
	return out, nil
}

func serveOne(ctx context.Context, addr string) (string, error) {
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
			go Echo(c)
		}
	}()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from) // an echo server: a lost reply is a lost datagram, which the client counts
		}
	}()
	return ln.Addr().String(), nil
}

// echoBuffers are Echo's read buffers: a short-lived connection each
// would otherwise allocate and clear 64 KiB (at 5,000 connections a
// second, a third of a gigabyte a second for the garbage collector).
var echoBuffers = sync.Pool{New: func() any { b := make([]byte, 65536); return &b }}

// Echo answers every read on c with the same bytes until c fails, then
// closes it. It copies with read/write rather than io.Copy, which would
// splice between two TCP sockets, and spliced receives are not traced.
func Echo(c net.Conn) {
	defer c.Close()
	bp := echoBuffers.Get().(*[]byte)
	defer echoBuffers.Put(bp)
	buf := *bp
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

// Schedule hands out the start times of an open-loop load: the k-th round
// trip is due at start + k/rate, whichever client is free to make it, so a
// client held up by a slow round trip does not hold its share of the rate
// back. A start that falls more than slack behind is dropped and counted:
// a rate the machine cannot reach shows as a lower achieved rate and as
// missed starts, never as a burst that hides a stall longer than slack.
type Schedule struct {
	start time.Time
	rate  float64
	slack time.Duration
	k     uint64 // next start
}

// NewSchedule paces at rate per second from start; rate 0 never waits.
func NewSchedule(rate float64, start time.Time, slack time.Duration) *Schedule {
	return &Schedule{start: start, rate: rate, slack: slack}
}

func (s *Schedule) due(k uint64) time.Time {
	return s.start.Add(time.Duration(float64(k) * float64(time.Second) / s.rate))
}

// Next takes the next start: how long to wait for it, and how many starts
// before it were dropped for being more than slack late at now.
func (s *Schedule) Next(now time.Time) (wait time.Duration, missed uint64) {
	if s.rate <= 0 {
		return 0, 0
	}
	if late := now.Sub(s.due(s.k)); late > s.slack {
		// The first start not more than slack late.
		k := uint64(float64(now.Add(-s.slack).Sub(s.start)) / float64(time.Second) * s.rate)
		for s.due(k).Before(now.Add(-s.slack)) {
			k++
		}
		missed, s.k = k-s.k, k
	}
	wait = s.due(s.k).Sub(now)
	s.k++
	return max(wait, 0), missed
}

// scheduleSlack is how far a paced load may fall behind and still catch
// up: a scheduler hiccup or a burst of slow round trips on a shared VM.
const scheduleSlack = 100 * time.Millisecond

type edgeKey struct {
	client string
	server string
}

// Run drives the load until cfg.Duration passes or ctx is done. With a
// Rate, one scheduler hands each start to a free client (open loop); the
// clients bound the round trips in flight at once.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var trips, errs, seq, missed atomic.Uint64
	var firstErr atomic.Pointer[string]
	lat := make([][]time.Duration, cfg.Concurrency)
	edges := make([]map[edgeKey]uint64, cfg.Concurrency)
	network := "tcp"
	if cfg.Workload == UDP {
		network = "udp"
	}
	var starts chan struct{}
	start := time.Now()
	if cfg.Rate > 0 {
		starts = make(chan struct{})
		go func() {
			sched := NewSchedule(cfg.Rate, start, scheduleSlack)
			for {
				wait, m := sched.Next(time.Now())
				missed.Add(m)
				if wait > 0 {
					select {
					case <-time.After(wait):
					case <-ctx.Done():
						return
					}
				}
				select {
				case starts <- struct{}{}: // blocks while every client is busy
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for w := 0; w < cfg.Concurrency; w++ {
		edges[w] = map[edgeKey]uint64{}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			req := make([]byte, cfg.MsgSize)
			resp := make([]byte, cfg.MsgSize)
			var conn net.Conn
			var key edgeKey
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for ctx.Err() == nil {
				if starts != nil {
					select {
					case <-starts:
					case <-ctx.Done():
						return
					}
				}
				t0 := time.Now()
				err := func() error {
					if conn == nil {
						// Persistent connections keep one peer pair each;
						// the others rotate so every pair gets traffic.
						i := seq.Add(1) - 1
						if cfg.Workload == TCPPersistent {
							i = uint64(w)
						}
						key = edgeKey{server: cfg.Addrs[i%uint64(len(cfg.Addrs))]}
						var src netip.Addr
						if len(cfg.Sources) > 0 {
							src = cfg.Sources[sourceIndex(i, len(cfg.Addrs), len(cfg.Sources))]
							key.client = src.String()
						}
						c, err := dialer(network, src).Dial(network, key.server)
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
				if cfg.Workload != TCPPersistent || err != nil {
					if conn != nil {
						conn.Close()
						conn = nil
					}
				}
				if err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
						msg := err.Error()
						firstErr.CompareAndSwap(nil, &msg)
					}
					continue
				}
				trips.Add(1)
				edges[w][key]++
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
	r := Result{Workload: cfg.Workload, TargetRate: cfg.Rate, RoundTrips: trips.Load(), Errors: errs.Load(), Elapsed: elapsed,
		Rate: float64(trips.Load()) / elapsed.Seconds(), Missed: missed.Load(), Clients: cfg.Concurrency}
	if p := firstErr.Load(); p != nil {
		r.FirstError = *p
	}
	r.Reached = cfg.Rate == 0 || r.Rate >= 0.95*cfg.Rate
	if len(all) > 0 {
		r.P50, r.P90, r.P99, r.Max = pct(all, 50), pct(all, 90), pct(all, 99), all[len(all)-1]
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		r.Mean = sum / time.Duration(len(all))
	}
	r.Edges = mergeEdges(edges, network)
	if r.RoundTrips == 0 {
		// Name the cause: a refused or unreachable server reads as such.
		if r.FirstError != "" {
			return r, fmt.Errorf("no round trip completed: %s (all %d attempts failed)", r.FirstError, r.Errors)
		}
		return r, fmt.Errorf("no round trip completed in %s: none was answered within it", cfg.Duration)
	}
	return r, nil
}

// dialer dials from source address src when it is valid (an emulated
// client host), else from the kernel's choice. A TCP source's port is
// left to connect() (IP_BIND_ADDRESS_NO_PORT), which needs only the
// 4-tuple to be free: bound to src:0 first, each connection would hold one
// of src's ports against every server, and the kernel's search of the bind
// table for a free one took the CPU (untraced, 1,439 connections/s of
// 5,000 from one source, inet_csk_get_port most of the machine's time).
func dialer(network string, src netip.Addr) *net.Dialer {
	d := &net.Dialer{Timeout: 5 * time.Second}
	if !src.IsValid() {
		return d
	}
	if network == "udp" {
		d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
		return d
	}
	d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	d.Control = func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set IP_BIND_ADDRESS_NO_PORT: %w", serr)
		}
		return nil
	}
	return d
}

// sourceIndex picks the source address of the i-th connection among
// nSources, with nAddrs servers: server i mod nAddrs, source (i / nAddrs)
// mod nSources, so every source meets every server and, with one server,
// the sources take turns.
func sourceIndex(i uint64, nAddrs, nSources int) uint64 {
	return (i / uint64(nAddrs)) % uint64(nSources)
}

// mergeEdges turns the workers' counts into the sorted ground truth.
func mergeEdges(per []map[edgeKey]uint64, proto string) []Edge {
	sum := map[edgeKey]uint64{}
	for _, m := range per {
		for k, n := range m {
			sum[k] += n
		}
	}
	out := make([]Edge, 0, len(sum))
	for k, n := range sum {
		ap, err := netip.ParseAddrPort(k.server)
		if err != nil {
			continue
		}
		out = append(out, Edge{Client: k.client, Server: ap.Addr().Unmap().String(), Port: ap.Port(), Proto: proto, RoundTrips: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Client != out[j].Client {
			return out[i].Client < out[j].Client
		}
		if out[i].Server != out[j].Server {
			return out[i].Server < out[j].Server
		}
		return out[i].Port < out[j].Port
	})
	return out
}

// Sources returns n loopback client addresses, 127.1.0.1 onwards, one per
// emulated client host.
func Sources(n int) ([]netip.Addr, error) {
	if n < 0 || n > 65000 {
		return nil, fmt.Errorf("invalid clients %d: allowed 0 to 65000", n)
	}
	out := make([]netip.Addr, n)
	for i := 0; i < n; i++ {
		out[i] = netip.AddrFrom4([4]byte{127, 1, byte((i + 1) / 256), byte((i + 1) % 256)})
	}
	return out, nil
}

func pct(sorted []time.Duration, p int) time.Duration {
	return sorted[(len(sorted)-1)*p/100]
}
