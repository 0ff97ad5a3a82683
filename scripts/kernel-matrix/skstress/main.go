// Command skstress stresses the kernel's socket-storage map iterator: a
// cgroup/sock_create program gives every new socket an element of an
// SK_STORAGE map, workers create and close sockets (TCP and UDP, loopback
// only) as fast as they can, and readers run an iter/bpf_sk_storage_map
// program over the map in a loop. With -delete, each socket's element is
// deleted before the socket can be freed (tp_btf at TCP_CLOSE, fentry on
// inet_release for UDP). -prog socks walks the TCP and UDP socket tables
// (iter/tcp, iter/udp) instead of the map. On an affected kernel the guest
// oopses; otherwise it prints what it did and exits 0.
//
// The recursion-miss experiments (-prog misses, misses2, plain, empty,
// none, marks1 .. marks8; -event send or state) attach programs to
// sock_send_length (threads sending on unix socket pairs, each send
// numbered in the thread's memory so that the programs can tell a send
// processed twice) or inet_sock_set_state (loopback TCP connections, each
// socket's last processed transition kept in socket storage), and compare
// what the programs processed with what user space did: sends or
// transitions lost, processed twice, and each program's recursion misses.
// marksN is the scheme of bpf/recmarks.h (N copies that mark each call in
// the task's storage); see docs/install.md. It is a research tool for the
// kernel matrix (scripts/kernel-matrix/skstress/run SERIES).
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

var seenFirst, weakStale bool

func main() {
	obj := flag.String("obj", "skstress.o", "the compiled skstress.bpf.c")
	prog := flag.String("prog", "walk_empty", "iterator program: walk_empty or walk_get (over the map), or socks (iter/tcp and iter/udp); or a recursion-miss experiment on sock_send_length under unix stream sends: misses (one program), misses2 (the per-CPU-flag backup), plain (one program, the cost baseline), empty (a program doing nothing), none (nothing attached), marks1 .. marks8 (the task-storage marks scheme with 1 to 8 copies); a comma-separated list of experiments runs them in turn")
	dur := flag.Duration("d", 60*time.Second, "how long to run (at most 10m)")
	workers := flag.Int("workers", 4, "socket churners or sending threads (1..64)")
	readers := flag.Int("readers", 2, "iterator readers (1..16)")
	cgroup := flag.String("cgroup", "/sys/fs/cgroup", "cgroup v2 root")
	udp := flag.Bool("udp", true, "churn UDP sockets too (TCP always)")
	del := flag.Bool("delete", false, "delete each socket's element before the socket is freed")
	runs := flag.Int("runs", 1, "recursion-miss experiments: how many times to run the list (1..20)")
	work := flag.Uint("work", 64, "recursion-miss experiments: atomic adds per processed send (0..256), the stand-in for deptrace's work")
	event := flag.String("event", "send", "recursion-miss experiments: send (sock_send_length, unix stream sends) or state (inet_sock_set_state, loopback TCP connections)")
	flag.BoolVar(&weakStale, "weak-stale", false, "marks: clear stale marks by the rule that holds on any architecture, not the x86-64 one (interrupts on their own stacks)")
	flag.BoolVar(&seenFirst, "seen", false, "-event state: attach a counting program (no storage) before the copies, to check what the tracepoint delivered")
	stats := flag.Bool("stats", false, "recursion-miss experiments: enable BPF run-time statistics while running and print ns per run of each copy")
	flag.Parse()
	if *dur <= 0 || *dur > 10*time.Minute || *workers < 1 || *workers > 64 || *readers < 1 || *readers > 16 || *runs < 1 || *runs > 20 || *work > 256 {
		fail(fmt.Errorf("-d must be in (0, 10m], -workers in 1..64, -readers in 1..16, -runs in 1..20, -work in 0..256"))
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		fail(err)
	}
	if *event != "send" && *event != "state" {
		fail(fmt.Errorf("-event %q: allowed are send and state", *event))
	}
	if _, ok := sendPrograms(strings.Split(*prog, ",")[0]); ok {
		modes := strings.Split(*prog, ",")
		for _, m := range modes {
			if _, ok := missPrograms(*event, m); !ok {
				fail(fmt.Errorf("-prog %q: %q is not a recursion-miss experiment for -event %s (allowed: misses, misses2 (send only), plain, empty, marks1 .. marks8, none)", *prog, m, *event))
			}
		}
		for r := 0; r < *runs; r++ {
			for _, m := range modes {
				run := misses
				if *event == "state" {
					run = stateMisses
				}
				if err := run(*obj, m, *dur, *workers, uint32(*work), *stats); err != nil {
					fail(err)
				}
			}
		}
		return
	}
	if *prog != "walk_empty" && *prog != "walk_get" && *prog != "socks" {
		fail(fmt.Errorf("-prog %q: allowed are walk_empty, walk_get, socks, and the recursion-miss experiments misses, misses2, plain, empty, none and marks1 .. marks8", *prog))
	}
	if err := run(*obj, *prog, *cgroup, *dur, *workers, *readers, *udp, *del); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "skstress:", err)
	os.Exit(1)
}

func run(obj, prog, cgroup string, dur time.Duration, workers, readers int, udp, del bool) error {
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		return fmt.Errorf("load %s: %w", obj, err)
	}
	for _, name := range []string{"on_send", "send_plain", "send_empty", "on_send_backup", "send_a", "send_mid", "send_last"} {
		delete(spec.Programs, name)
	}
	if !del {
		delete(spec.Programs, "tcp_closed")
		delete(spec.Programs, "udp_release")
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return fmt.Errorf("create collection: %w", err)
	}
	defer coll.Close()
	stats, st := coll.Maps["stats"], coll.Maps["st"]
	cl, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupInetSockCreate, Program: coll.Programs["tag"]})
	if err != nil {
		return fmt.Errorf("attach sock_create: %w", err)
	}
	defer cl.Close()
	if del {
		tl, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs["tcp_closed"]})
		if err != nil {
			return fmt.Errorf("attach tcp_closed: %w", err)
		}
		defer tl.Close()
		ul, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs["udp_release"]})
		if err != nil {
			return fmt.Errorf("attach udp_release: %w", err)
		}
		defer ul.Close()
	}
	var iters []*link.Iter
	if prog == "socks" {
		for _, name := range []string{"walk_tcp", "walk_udp"} {
			it, err := link.AttachIter(link.IterOptions{Program: coll.Programs[name]})
			if err != nil {
				return fmt.Errorf("attach %s: %w", name, err)
			}
			defer it.Close()
			iters = append(iters, it)
		}
	} else {
		it, err := link.AttachIter(link.IterOptions{Program: coll.Programs[prog], Map: st})
		if err != nil {
			return fmt.Errorf("attach iterator: %w", err)
		}
		defer it.Close()
		iters = append(iters, it)
	}

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var socks, walks atomic.Uint64
	var errs []error
	var mu sync.Mutex
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if i%2 == 0 || !udp {
					c, err := net.Dial("tcp4", ln.Addr().String())
					if err == nil {
						c.Close()
					}
				} else {
					c, err := net.ListenPacket("udp4", "127.0.0.1:0")
					if err == nil {
						c.Close()
					}
				}
				socks.Add(1)
			}
		}(i)
	}
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; time.Now().Before(deadline); k++ {
				r, err := iters[k%len(iters)].Open()
				if err == nil {
					_, err = io.Copy(io.Discard, r)
					_ = r.Close()
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				walks.Add(1)
			}
		}()
	}
	report := func(final bool) {
		var n [8]uint64
		for i := range n {
			_ = stats.Lookup(uint32(i), &n[i])
		}
		word := "so far"
		if final {
			word = "done"
		}
		fmt.Printf("skstress %s: %s (udp %v, delete %v): %d sockets made, %d elements created, %d create failed, %d deleted, %d delete failed, %d iterator runs, %d elements visited (empty), %d (get)\n",
			word, prog, udp, del, socks.Load(), n[0], n[1], n[4], n[5], walks.Load(), n[2], n[3])
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Second):
				report(false)
			}
		}
	}()
	wg.Wait()
	close(done)
	report(true)
	if len(errs) > 0 {
		return fmt.Errorf("iterator read: %w", errs[0])
	}
	return nil
}

// The recursion-miss experiments (-prog), and the programs each attaches
// to sock_send_length, in this order (the order the tracepoint runs them).
// marksN: copy A, N-2 middle copies (each its own program, loaded from
// send_mid), the last copy.
func missPrograms(event, mode string) ([]string, bool) {
	names, ok := sendPrograms(mode)
	if !ok || event == "send" {
		return names, ok
	}
	if mode == "misses2" {
		return nil, false // the per-CPU-flag backup exists for sends only
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = strings.NewReplacer("on_send", "state_one", "send_plain", "state_one", "send_empty", "state_one", "send_", "state_").Replace(n)
	}
	return out, true
}

func sendPrograms(mode string) ([]string, bool) {
	switch mode {
	case "none":
		return []string{}, true // nothing attached: the cost baseline
	case "misses":
		return []string{"on_send"}, true // one program, as deptrace today
	case "empty":
		return []string{"send_empty"}, true // a program that does nothing: the bpf_stats floor
	case "plain":
		return []string{"send_plain"}, true // one program without misses2's flag: the cost baseline
	case "misses2":
		return []string{"on_send", "on_send_backup"}, true // the per-CPU-flag backup
	case "marks1":
		return []string{"send_a"}, true // copy A alone: the marking cost without a backup
	}
	n, err := strconv.Atoi(strings.TrimPrefix(mode, "marks"))
	if !strings.HasPrefix(mode, "marks") || err != nil || n < 2 || n > 8 {
		return nil, false
	}
	names := []string{"send_a"}
	for i := 2; i < n; i++ {
		names = append(names, fmt.Sprintf("send_mid%d", i))
	}
	return append(names, "send_last"), true
}

const (
	cAProc = iota
	cANoStore
	cAFull
	cBRescued
	cBSeen
	cBUnmarked
	cCRescued
	cCSeen
	cStale
	cOldBackup
	cMax
)

type thr struct{ SeqAddr, Last, Processed, Dups, Gaps, Unread uint64 }

// misses attaches the mode's programs to sock_send_length and makes unix
// stream sends (process context only) from more threads than CPUs, each
// thread sending lengths 1..61 in a cycle; then it compares what the
// programs processed with what the threads sent: sends lost, sends
// processed twice (dups), and the kernel's recursion misses of each copy.
// Where tracepoint programs run with preemption disabled (6.12), nothing can
// nest a run here and the misses stay 0.
// experiment is one recursion-miss experiment's programs, attached.
type experiment struct {
	coll  *ebpf.Collection
	names []string
	close []io.Closer
}

func (e *experiment) Close() {
	for i := len(e.close) - 1; i >= 0; i-- {
		_ = e.close[i].Close()
	}
	e.coll.Close()
}

// loadExperiment loads the programs of an experiment (with the given
// constants) and attaches them in order, the order the tracepoint runs them.
func loadExperiment(obj, event, mode string, consts map[string]any, stats bool) (*experiment, error) {
	names, _ := missPrograms(event, mode)
	if event == "state" && seenFirst {
		names = append([]string{"state_seen"}, names...)
	}
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", obj, err)
	}
	keep := map[string]bool{}
	for _, n := range names {
		keep[n] = true
		if i := strings.Index(n, "_mid"); i >= 0 {
			// Each middle copy is a program of its own (its own
			// recursion guard), sharing the collection's maps.
			c := spec.Programs[n[:i+4]].Copy()
			c.Name = n
			spec.Programs[n] = c
		}
	}
	for name := range spec.Programs {
		if !keep[name] {
			delete(spec.Programs, name)
		}
	}
	if weakStale {
		consts["rec_irq_own_stacks"] = uint32(0)
	}
	for k, v := range consts {
		if err := spec.Variables[k].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", k, err)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return nil, fmt.Errorf("create collection: %w", err)
	}
	e := &experiment{coll: coll, names: names}
	if stats {
		st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("enable bpf stats: %w", err)
		}
		e.close = append(e.close, st)
	}
	for _, n := range names {
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[n]})
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("attach %s: %w", n, err)
		}
		e.close = append(e.close, l)
	}
	return e, nil
}

// report prints each copy's recursion misses (and run time with -stats)
// and, for the marks scheme, what the copies did and the loss they count.
func (e *experiment) report(mode string, stats bool) error {
	var c [cMax]uint64
	for i := range c {
		var per []uint64
		if err := e.coll.Maps["cnt"].Lookup(uint32(i), &per); err != nil {
			return fmt.Errorf("counters: %w", err)
		}
		for _, v := range per {
			c[i] += v
		}
	}
	var missA uint64
	for i, name := range e.names {
		st, err := e.coll.Programs[name].Stats()
		if err != nil {
			return fmt.Errorf("program stats: %w", err)
		}
		if name == e.names[0] && name == "state_seen" {
			// not a copy
		} else if missA == 0 && (name == "on_send" || strings.HasSuffix(name, "_a") || name == "state_one") {
			missA = st.RecursionMisses
		}
		_ = i
		line := fmt.Sprintf("  %-14s recursion misses %d", name, st.RecursionMisses)
		if stats && st.RunCount > 0 {
			line += fmt.Sprintf(", %d runs, %.1f ns/run", st.RunCount, float64(st.Runtime.Nanoseconds())/float64(st.RunCount))
		}
		fmt.Println(line)
	}
	if mode == "misses2" {
		fmt.Printf("  old backup did the work %d times\n", c[cOldBackup])
	}
	if strings.HasPrefix(mode, "marks") {
		rescued := c[cBRescued] + c[cCRescued]
		fmt.Printf("  A processed %d, no storage %d, slots full %d, stale marks cleared %d; middle copies: saw mark %d, rescued %d, could not mark %d; last copy: saw mark %d, rescued %d\n",
			c[cAProc], c[cANoStore], c[cAFull], c[cStale], c[cBSeen], c[cBRescued], c[cBUnmarked], c[cCSeen], c[cCRescued])
		if len(e.names) > 1 {
			fmt.Printf("  lost as the programs count it (A misses + A no storage + A slots full - rescued): %d\n", int64(missA+c[cANoStore]+c[cAFull])-int64(rescued))
		}
	}
	return nil
}

func misses(obj, mode string, dur time.Duration, workers int, work uint32, stats bool) error {
	e, err := loadExperiment(obj, "send", mode, map[string]any{"target_tgid": uint32(os.Getpid()), "work_loops": work}, stats)
	if err != nil {
		return err
	}
	defer e.Close()
	coll := e.coll
	runtime.GOMAXPROCS(4 * runtime.NumCPU())
	threads := coll.Maps["threads"]
	var sends atomic.Uint64
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	errc := make(chan error, workers)
	tids := make(chan uint32, workers)
	// Each thread numbers its sends here (8 words apart: no false sharing);
	// the programs read the number in the thread's write(2). Go's heap
	// does not move, so the addresses hold until the end.
	seqs := make([]uint64, 8*workers)
	defer runtime.KeepAlive(seqs)
	for i := 0; i < workers; i++ {
		seq := &seqs[8*i]
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return fmt.Errorf("socketpair: %w", err)
		}
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			defer func() { _ = unix.Close(fds[0]) }()
			defer func() { _ = unix.Close(fds[1]) }()
			runtime.LockOSThread()
			tid := uint32(unix.Gettid())
			err := threads.Put(tid, thr{SeqAddr: uint64(uintptr(unsafe.Pointer(seq)))})
			tids <- tid
			ready.Done()
			if err != nil {
				errc <- fmt.Errorf("threads map: %w", err)
				return
			}
			<-start
			msg, buf := []byte("12345678"), make([]byte, 64)
			deadline := time.Now().Add(dur)
			for k := uint64(1); time.Now().Before(deadline); k++ {
				atomic.StoreUint64(seq, k)
				if _, err := unix.Write(fds[0], msg); err != nil {
					errc <- fmt.Errorf("write: %w", err)
					return
				}
				if _, err := unix.Read(fds[1], buf); err != nil {
					errc <- fmt.Errorf("read: %w", err)
					return
				}
				sends.Add(1)
			}
		}()
	}
	ready.Wait()
	close(start)
	wg.Wait()
	close(errc)
	close(tids)
	if err := <-errc; err != nil {
		return err
	}
	var sum thr
	for tid := range tids {
		var t thr
		if err := threads.Lookup(tid, &t); err != nil {
			return fmt.Errorf("threads map: %w", err)
		}
		sum.Processed += t.Processed
		sum.Dups += t.Dups
		sum.Gaps += t.Gaps
		sum.Unread += t.Unread
	}
	n := sends.Load()
	unique := sum.Processed - sum.Dups
	fmt.Printf("skstress done: %s (%d threads, %d CPUs, %s, work %d): %d unix sends (%.0f ns per send and thread), %d processed once, %d processed twice (dups), %d lost (%.3f %%), %d gaps seen, %d send numbers unreadable\n",
		mode, workers, runtime.NumCPU(), dur, work, n, float64(dur.Nanoseconds())*float64(workers)/float64(max(n, 1)), unique, sum.Dups, int64(n)-int64(unique), 100*float64(int64(n)-int64(unique))/float64(max(n, 1)), sum.Gaps, sum.Unread)
	return e.report(mode, stats)
}

func tcpState(s uint32) string {
	names := []string{"?", "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2", "TIME_WAIT", "CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING", "NEW_SYN_RECV"}
	if int(s) < len(names) {
		return names[s]
	}
	return strconv.Itoa(int(s))
}

// stateMisses attaches the mode's programs to inet_sock_set_state and makes
// loopback TCP connections from several client threads to one listener
// (the server closes each connection after reading the client's EOF), then
// compares the counted transitions with four per completed connection
// (client: to SYN_SENT, to ESTABLISHED, to CLOSE; server child: to
// ESTABLISHED).
func stateMisses(obj, mode string, dur time.Duration, workers int, work uint32, stats bool) error {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	e, err := loadExperiment(obj, "state", mode, map[string]any{"target_port": port, "work_loops": work}, stats)
	if err != nil {
		return err
	}
	defer e.Close()
	runtime.GOMAXPROCS(4 * runtime.NumCPU())
	var served, connected, failed atomic.Uint64
	var sg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			sg.Add(1)
			go func() {
				defer sg.Done()
				_, _ = io.Copy(io.Discard, c)
				c.Close()
				served.Add(1)
			}()
		}
	}()
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				c, err := net.Dial("tcp4", ln.Addr().String())
				if err != nil {
					failed.Add(1)
					continue
				}
				connected.Add(1)
				c.Close()
			}
		}()
	}
	wg.Wait()
	// Let every connection finish closing (bounded: 60 s): the server has
	// closed them all and no socket of the port is in any state but LISTEN
	// and TIME_WAIT (a segment lost on a busy loopback is retransmitted
	// later).
	busy := 0
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if busy = closing(port); served.Load() == connected.Load() && busy == 0 {
			break
		}
	}
	if busy > 0 || served.Load() != connected.Load() {
		fmt.Printf("skstress: after 60 s, %d connections not served, %d sockets still closing: the counts below are not exact\n", connected.Load()-served.Load(), busy)
	}
	var st [16]uint64
	for i := range st {
		_ = e.coll.Maps["stats"].Lookup(uint32(i), &st[i])
	}
	expected := 4 * served.Load()
	unique := st[8] - st[9]
	fmt.Printf("skstress done: state %s (%d client threads, %d CPUs, %s, work %d): %d connections (%d served, %d failed), %d transitions expected, %d processed once, %d processed twice (dups; %d of any kind), %d lost (%.3f %%), %d unchecked, %d seen by state_seen\n",
		mode, workers, runtime.NumCPU(), dur, work, connected.Load(), served.Load(), failed.Load(), expected, unique, st[9], st[10],
		int64(expected)-int64(unique), 100*float64(int64(expected)-int64(unique))/float64(max(expected, 1)), st[11], st[12])
	var kind uint32
	var kn uint64
	var kinds []string
	for it := e.coll.Maps["kinds"].Iterate(); it.Next(&kind, &kn); {
		kinds = append(kinds, fmt.Sprintf("%s->%s %d", tcpState(kind>>8), tcpState(kind&0xff), kn))
	}
	sort.Strings(kinds)
	fmt.Printf("  processed transitions by kind: %s\n", strings.Join(kinds, ", "))
	return e.report(mode, stats)
}

// closing counts the TCP sockets of a local or remote port in
// /proc/net/tcp that are in any state but LISTEN (0A) and TIME_WAIT (06).
func closing(port uint16) int {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return -1
	}
	hex := fmt.Sprintf(":%04X", port)
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || (!strings.HasSuffix(f[1], hex) && !strings.HasSuffix(f[2], hex)) {
			continue
		}
		if f[3] != "0A" && f[3] != "06" {
			n++
		}
	}
	return n
}
