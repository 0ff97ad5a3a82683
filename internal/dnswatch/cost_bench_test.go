package dnswatch_test

// What DNS watching costs (docs/performance.md, "DNS watching"):
//
//	go test -run '^$' -bench DNSCost -benchtime 1x ./internal/dnswatch/
//
// as root. It measures, in test namespaces:
//   - a DNS lookup load at 5,000 lookups/s (a new connected UDP socket per
//     lookup, as glibc's resolver does; a small server answering one A
//     record), in interleaved pairs of runs without and with the watcher:
//     the whole machine's extra busy CPU (/proc/stat) per lookup;
//   - with kernel.bpf_stats_enabled, the watcher's programs' runs per
//     lookup and per persistent TCP round trip (64 bytes each way), net of
//     the machine's other traffic counted in an idle run just before;
//   - the programs' own time per run (BPF_PROG_TEST_RUN, 10,000 repeats,
//     no preemption inside): on a non-DNS TCP segment (the port test
//     every other packet pays) and on a DNS query and answer (the copy).

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

const (
	costRate    = 5000 // lookups per second
	costWorkers = 4
	costPairs   = 10
	costPhase   = 5 * time.Second
)

// answerA serves DNS on h's IPv4 address: every query gets one A record.
func answerA(b *testing.B, h *testnet.Host) {
	pc := h.ListenPacket(b, "udp4", net.JoinHostPort(h.IPv4.String(), "53"))
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			out := append([]byte(nil), buf[:n]...)
			out[2] |= 0x80                         // QR
			binary.BigEndian.PutUint16(out[6:], 1) // ANCOUNT
			out = append(out, 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 9)
			_, _ = pc.WriteTo(out, from)
		}
	}()
}

// lookupQuery is a query for cost.test.example, A.
var lookupQuery = func() []byte {
	q := []byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range strings.Split("cost.test.example", ".") {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	return append(q, 0, 0, 1, 0, 1)
}()

// lookups runs costRate lookups a second from h to server for d, each
// from a new connected socket; it returns how many were answered.
func lookups(b *testing.B, h *testnet.Host, server string, d time.Duration) uint64 {
	var done atomic.Uint64
	var wg sync.WaitGroup
	start := time.Now()
	per := time.Second * costWorkers / costRate
	for w := range costWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = netns.Do(h.Path, func() error {
				q := append([]byte(nil), lookupQuery...)
				buf := make([]byte, 512)
				for i := 0; ; i++ {
					at := start.Add(time.Duration(i)*per + time.Duration(w)*per/costWorkers)
					if at.Sub(start) >= d {
						return nil
					}
					time.Sleep(time.Until(at))
					c, err := net.Dial("udp4", server)
					if err != nil {
						continue
					}
					binary.BigEndian.PutUint16(q, uint16(i*costWorkers+w))
					_ = c.SetDeadline(time.Now().Add(time.Second))
					if _, err := c.Write(q); err == nil {
						if _, err := c.Read(buf); err == nil {
							done.Add(1)
						}
					}
					c.Close()
				}
			})
		}()
	}
	wg.Wait()
	return done.Load()
}

func machineBusy(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	var busy uint64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system irq softirq
		v, _ := strconv.ParseUint(f[i], 10, 64)
		busy += v
	}
	return time.Duration(busy) * time.Second / 100
}

func startWatcher(b *testing.B) *dnswatch.Watcher {
	w, err := dnswatch.New(dnswatch.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// applyEvery applies the watcher to an empty interval every second, as
// trace and agent do, until stop is closed.
func applyEvery(w *dnswatch.Watcher, stop chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			iv := tracer.Interval{Time: time.Now()}
			w.Apply(&iv)
		}
	}
}

func BenchmarkDNSCost(b *testing.B) {
	testnet.RequireRoot(b)
	nw := testnet.New(b, 2)
	client, srv := nw.Hosts[0], nw.Hosts[1]
	answerA(b, srv)
	server := net.JoinHostPort(srv.IPv4.String(), "53")

	// Whole machine: pairs of runs without and with the watcher.
	var extra []float64
	var rates [2]float64
	for p := range costPairs {
		var perLookup [2]float64
		for _, on := range []int{p % 2, 1 - p%2} { // alternate which goes first
			var w *dnswatch.Watcher
			stop, wg := make(chan struct{}), &sync.WaitGroup{}
			if on == 1 {
				w = startWatcher(b)
				wg.Add(1)
				go applyEvery(w, stop, wg)
			}
			t0, busy0 := time.Now(), machineBusy(b)
			n := lookups(b, client, server, costPhase)
			busy, wall := machineBusy(b)-busy0, time.Since(t0)
			if w != nil {
				close(stop)
				wg.Wait()
				_ = w.Close()
			}
			if n < uint64(0.95*costRate*costPhase.Seconds()) {
				b.Fatalf("only %d lookups answered in %s: the load did not reach %d/s", n, costPhase, costRate)
			}
			perLookup[on] = float64(busy.Microseconds()) / float64(n)
			rates[on] += float64(n) / wall.Seconds() / costPairs
		}
		extra = append(extra, perLookup[1]-perLookup[0])
	}
	med := median(extra)
	b.ReportMetric(med, "extra-us/lookup")
	b.Logf("extra busy CPU per lookup over %d pairs (us): %v; median %.2f; lookups/s off %.0f on %.0f", costPairs, round2(extra), med, rates[0], rates[1])

	// bpf_stats: the programs' runs and run time.
	statsOff, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer statsOff.Close()
	w := startWatcher(b)
	defer w.Close()
	stop, wg := make(chan struct{}), &sync.WaitGroup{}
	wg.Add(1)
	go applyEvery(w, stop, wg)
	r0, _, _ := w.ProgramStats()
	time.Sleep(costPhase)
	r1, _, _ := w.ProgramStats()
	idle := r1 - r0 // the machine's other traffic over one phase
	n := lookups(b, client, server, costPhase)
	r2, _, _ := w.ProgramStats()
	dnsRuns := (float64(r2-r1) - float64(idle)) / float64(n)
	b.ReportMetric(dnsRuns, "runs/lookup")

	// Non-DNS traffic: persistent TCP round trips, flat out, one connection.
	ln := srv.Listen(b, "tcp4", net.JoinHostPort(srv.IPv4.String(), "8080"))
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 64)
		for {
			if _, err := c.Read(buf); err != nil {
				c.Close()
				return
			}
			_, _ = c.Write(buf)
		}
	}()
	c, err := client.Dial("tcp4", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg, buf := make([]byte, 64), make([]byte, 64)
	r0, _, _ = w.ProgramStats()
	rts := 0
	for end := time.Now().Add(costPhase); time.Now().Before(end); rts++ {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
	r1, _, _ = w.ProgramStats()
	close(stop)
	wg.Wait()
	tcpRuns := (float64(r1-r0) - float64(idle)) / float64(rts)
	b.ReportMetric(tcpRuns, "runs/tcp-roundtrip")

	// The programs' own time per run on crafted packets.
	egress, ingress := w.Programs()
	query := packet(17, 40000, 53, lookupQuery)
	answer := packet(17, 53, 40000, append(append([]byte(nil), lookupQuery...), 0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 203, 0, 113, 9))
	segment := packet(6, 40000, 8080, make([]byte, 64))
	per := func(p *ebpf.Program, pkt []byte) float64 {
		_, d, err := p.Benchmark(pkt, 10000, nil)
		if err != nil {
			b.Fatal(err)
		}
		return float64(d.Nanoseconds())
	}
	// The floor: a cgroup_skb program that only returns 1, on the same
	// segment (the test run's own cost per repeat).
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSKB, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		b.Fatal(err)
	}
	defer empty.Close()
	floor := per(empty, segment)
	b.ReportMetric(floor, "ns/run(empty)")
	nonDNSOut, nonDNSIn := per(egress, segment), per(ingress, segment)
	queryNs, answerNs := per(egress, query), per(ingress, answer)
	b.ReportMetric(nonDNSOut, "ns/run(non-dns,egress)")
	b.ReportMetric(nonDNSIn, "ns/run(non-dns,ingress)")
	b.ReportMetric(queryNs, "ns/run(dns-query)")
	b.ReportMetric(answerNs, "ns/run(dns-answer)")
	b.Logf("runs net of the machine's other traffic (%d in an idle %s): %.2f per lookup (%d lookups), %.2f per persistent TCP round trip (%d round trips); "+
		"test run ns: empty program %.0f, non-DNS egress %.0f ingress %.0f, DNS query %.0f answer %.0f; watcher %+v",
		idle, costPhase, dnsRuns, n, tcpRuns, rts, floor, nonDNSOut, nonDNSIn, queryNs, answerNs, w.Stats())
}

// packet is an Ethernet frame with an IPv4 header and a UDP (17) or TCP
// (6) header from sport to dport, then payload, as BPF_PROG_TEST_RUN
// takes it.
func packet(proto byte, sport, dport uint16, payload []byte) []byte {
	l4 := 8
	if proto == 6 {
		l4 = 20
	}
	p := make([]byte, 14+20+l4, 14+20+l4+len(payload))
	binary.BigEndian.PutUint16(p[12:], 0x0800)
	ip := p[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(20+l4+len(payload)))
	copy(ip[12:], []byte{198, 51, 100, 1, 198, 51, 100, 2})
	th := ip[20:]
	binary.BigEndian.PutUint16(th[0:], sport)
	binary.BigEndian.PutUint16(th[2:], dport)
	if proto == 6 {
		th[12] = 5 << 4
		th[13] = 0x18 // PSH ACK
	} else {
		binary.BigEndian.PutUint16(th[4:], uint16(8+len(payload)))
	}
	return append(p, payload...)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func round2(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return out
}
