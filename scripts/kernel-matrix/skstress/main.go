// Command skstress stresses the kernel's socket-storage map iterator: a
// cgroup/sock_create program gives every new socket an element of an
// SK_STORAGE map, workers create and close sockets (TCP and UDP, loopback
// only) as fast as they can, and readers run an iter/bpf_sk_storage_map
// program over the map in a loop. With -delete, each socket's element is
// deleted before the socket can be freed (tp_btf at TCP_CLOSE, fentry on
// inet_release for UDP). -prog socks walks the TCP and UDP socket tables
// (iter/tcp, iter/udp) instead of the map. -prog misses has no iterator: it
// counts how many runs of a sock_send_length program the kernel skips for
// recursion while threads send on unix socket pairs. It is a research tool for the kernel
// matrix (scripts/kernel-matrix/skstress/run SERIES): on an affected kernel
// the guest oopses; otherwise it prints what it did and exits 0.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
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

func main() {
	obj := flag.String("obj", "skstress.o", "the compiled skstress.bpf.c")
	prog := flag.String("prog", "walk_empty", "iterator program: walk_empty or walk_get (over the map), or socks (iter/tcp and iter/udp); or a recursion-miss experiment on sock_send_length under unix stream sends: misses (one program), misses2 (the per-CPU-flag backup), marks1 .. marks8 (the task-storage marks scheme with 1 to 8 copies); a comma-separated list of experiments runs them in turn")
	dur := flag.Duration("d", 60*time.Second, "how long to run (at most 10m)")
	workers := flag.Int("workers", 4, "socket churners or sending threads (1..64)")
	readers := flag.Int("readers", 2, "iterator readers (1..16)")
	cgroup := flag.String("cgroup", "/sys/fs/cgroup", "cgroup v2 root")
	udp := flag.Bool("udp", true, "churn UDP sockets too (TCP always)")
	del := flag.Bool("delete", false, "delete each socket's element before the socket is freed")
	runs := flag.Int("runs", 1, "recursion-miss experiments: how many times to run the list (1..20)")
	work := flag.Uint("work", 64, "recursion-miss experiments: atomic adds per processed send (0..256), the stand-in for deptrace's work")
	stats := flag.Bool("stats", false, "recursion-miss experiments: enable BPF run-time statistics while running and print ns per run of each copy")
	flag.Parse()
	if *dur <= 0 || *dur > 10*time.Minute || *workers < 1 || *workers > 64 || *readers < 1 || *readers > 16 || *runs < 1 || *runs > 20 || *work > 256 {
		fail(fmt.Errorf("-d must be in (0, 10m], -workers in 1..64, -readers in 1..16, -runs in 1..20, -work in 0..256"))
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		fail(err)
	}
	if _, ok := missPrograms(strings.Split(*prog, ",")[0]); ok {
		modes := strings.Split(*prog, ",")
		for _, m := range modes {
			if _, ok := missPrograms(m); !ok {
				fail(fmt.Errorf("-prog %q: %q is not a recursion-miss experiment (allowed: misses, misses2, marks1 .. marks8)", *prog, m))
			}
		}
		for r := 0; r < *runs; r++ {
			for _, m := range modes {
				if err := misses(*obj, m, *dur, *workers, uint32(*work), *stats); err != nil {
					fail(err)
				}
			}
		}
		return
	}
	if *prog != "walk_empty" && *prog != "walk_get" && *prog != "socks" {
		fail(fmt.Errorf("-prog %q: allowed are walk_empty, walk_get, socks, misses, misses2 and marks1 .. marks8", *prog))
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
	for _, name := range []string{"on_send", "on_send_backup", "send_a", "send_mid", "send_last"} {
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
					r.Close()
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
func missPrograms(mode string) ([]string, bool) {
	switch mode {
	case "misses":
		return []string{"on_send"}, true // one program, as deptrace today
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
func misses(obj, mode string, dur time.Duration, workers int, work uint32, stats bool) error {
	names, _ := missPrograms(mode)
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		return fmt.Errorf("load %s: %w", obj, err)
	}
	keep := map[string]bool{}
	for _, n := range names {
		keep[n] = true
		if strings.HasPrefix(n, "send_mid") {
			// Each middle copy is a program of its own (its own
			// recursion guard), sharing the collection's maps.
			c := spec.Programs["send_mid"].Copy()
			c.Name = n
			spec.Programs[n] = c
		}
	}
	for name := range spec.Programs {
		if !keep[name] {
			delete(spec.Programs, name)
		}
	}
	if err := spec.Variables["target_tgid"].Set(uint32(os.Getpid())); err != nil {
		return fmt.Errorf("set target_tgid: %w", err)
	}
	if err := spec.Variables["work_loops"].Set(work); err != nil {
		return fmt.Errorf("set work_loops: %w", err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return fmt.Errorf("create collection: %w", err)
	}
	defer coll.Close()
	if stats {
		st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			return fmt.Errorf("enable bpf stats: %w", err)
		}
		defer st.Close()
	}
	// Attach order is the order the tracepoint runs them in.
	for _, n := range names {
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[n]})
		if err != nil {
			return fmt.Errorf("attach %s: %w", n, err)
		}
		defer l.Close()
	}
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
			defer unix.Close(fds[0])
			defer unix.Close(fds[1])
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
	var c [cMax]uint64
	for i := range c {
		var per []uint64
		if err := coll.Maps["cnt"].Lookup(uint32(i), &per); err != nil {
			return fmt.Errorf("counters: %w", err)
		}
		for _, v := range per {
			c[i] += v
		}
	}
	n := sends.Load()
	unique := sum.Processed - sum.Dups
	fmt.Printf("skstress done: %s (%d threads, %d CPUs, %s, work %d): %d unix sends, %d processed once, %d processed twice (dups), %d lost (%.3f %%), %d gaps seen, %d send numbers unreadable\n",
		mode, workers, runtime.NumCPU(), dur, work, n, unique, sum.Dups, int64(n)-int64(unique), 100*float64(int64(n)-int64(unique))/float64(max(n, 1)), sum.Gaps, sum.Unread)
	var missA uint64
	for i, name := range names {
		st, err := coll.Programs[name].Stats()
		if err != nil {
			return fmt.Errorf("program stats: %w", err)
		}
		if i == 0 {
			missA = st.RecursionMisses
		}
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
		if len(names) > 1 {
			fmt.Printf("  lost as the programs count it (A misses + A no storage + A slots full - rescued): %d\n", int64(missA+c[cANoStore]+c[cAFull])-int64(rescued))
		}
	}
	return nil
}
