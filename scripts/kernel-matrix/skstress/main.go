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
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

func main() {
	obj := flag.String("obj", "skstress.o", "the compiled skstress.bpf.c")
	prog := flag.String("prog", "walk_empty", "iterator program: walk_empty or walk_get (over the map), or socks (iter/tcp and iter/udp); or misses: no iterator, count the recursion misses of a sock_send_length program under unix stream sends")
	dur := flag.Duration("d", 60*time.Second, "how long to run (at most 10m)")
	workers := flag.Int("workers", 4, "socket churners (1..64)")
	readers := flag.Int("readers", 2, "iterator readers (1..16)")
	cgroup := flag.String("cgroup", "/sys/fs/cgroup", "cgroup v2 root")
	udp := flag.Bool("udp", true, "churn UDP sockets too (TCP always)")
	del := flag.Bool("delete", false, "delete each socket's element before the socket is freed")
	flag.Parse()
	if *prog != "walk_empty" && *prog != "walk_get" && *prog != "socks" && *prog != "misses" && *prog != "misses2" {
		fail(fmt.Errorf("-prog %q: allowed are walk_empty, walk_get, socks, misses and misses2", *prog))
	}
	if *dur <= 0 || *dur > 10*time.Minute || *workers < 1 || *workers > 64 || *readers < 1 || *readers > 16 {
		fail(fmt.Errorf("-d must be in (0, 10m], -workers in 1..64, -readers in 1..16"))
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		fail(err)
	}
	if *prog == "misses" || *prog == "misses2" {
		if err := misses(*obj, *dur, *workers, *prog == "misses2"); err != nil {
			fail(err)
		}
		return
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
	delete(spec.Programs, "on_send")
	delete(spec.Programs, "on_send_backup")
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

// misses attaches on_send alone and makes unix stream sends (process context
// only) from more threads than CPUs, then prints how many runs the kernel
// skipped for recursion. Where tracepoint programs run with preemption
// disabled (6.12), nothing can nest a run here and the count stays 0.
func misses(obj string, dur time.Duration, workers int, backup bool) error {
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		return fmt.Errorf("load %s: %w", obj, err)
	}
	keep := map[string]bool{"on_send": true, "on_send_backup": backup}
	for name := range spec.Programs {
		if !keep[name] {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return fmt.Errorf("create collection: %w", err)
	}
	defer coll.Close()
	l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs["on_send"]})
	if err != nil {
		return fmt.Errorf("attach on_send: %w", err)
	}
	defer l.Close()
	if backup {
		lb, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs["on_send_backup"]})
		if err != nil {
			return fmt.Errorf("attach on_send_backup: %w", err)
		}
		defer lb.Close()
	}
	runtime.GOMAXPROCS(4 * runtime.NumCPU())
	deadline := time.Now().Add(dur)
	var sends atomic.Uint64
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return fmt.Errorf("socketpair: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer unix.Close(fds[0])
			defer unix.Close(fds[1])
			runtime.LockOSThread()
			msg, buf := []byte("12345678"), make([]byte, 64)
			for time.Now().Before(deadline) {
				if _, err := unix.Write(fds[0], msg); err != nil {
					return
				}
				if _, err := unix.Read(fds[1], buf); err != nil {
					return
				}
				sends.Add(1)
			}
		}()
	}
	wg.Wait()
	st, err := coll.Programs["on_send"].Stats()
	if err != nil {
		return fmt.Errorf("program stats: %w", err)
	}
	var runs, rescued uint64
	_ = coll.Maps["stats"].Lookup(uint32(6), &runs)
	_ = coll.Maps["stats"].Lookup(uint32(8), &rescued)
	line := fmt.Sprintf("skstress done: misses (%d threads, %d CPUs) for %s: %d unix sends, %d program runs counted, %d recursion misses",
		workers, runtime.NumCPU(), dur, sends.Load(), runs, st.RecursionMisses)
	if backup {
		bst, err := coll.Programs["on_send_backup"].Stats()
		if err != nil {
			return fmt.Errorf("program stats: %w", err)
		}
		line += fmt.Sprintf("; the backup copy did %d of the skipped runs' work and missed %d itself; sends not counted: %d",
			rescued, bst.RecursionMisses, int64(sends.Load())-int64(runs)-int64(rescued))
	}
	fmt.Println(line)
	return nil
}
