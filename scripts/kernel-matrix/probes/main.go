// Command probes loads each program of probes.bpf.c on its own, attaches it,
// makes loopback TCP and unix traffic, runs the iterators and prints, per
// program, whether it loaded, attached and fired on the running kernel. It is
// a research tool for the kernel matrix (run it in a guest with
// scripts/kernel-matrix/probes/run SERIES); it asserts nothing.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

func main() {
	obj := flag.String("obj", "probes.o", "the compiled probes.bpf.c")
	cgroup := flag.String("cgroup", "/sys/fs/cgroup", "cgroup v2 root for cgroup programs")
	flag.Parse()
	if err := rlimit.RemoveMemlock(); err != nil {
		fmt.Printf("PROBE rlimit.RemoveMemlock: %v\n", err)
	}
	if err := run(*obj, *cgroup); err != nil {
		fmt.Fprintln(os.Stderr, "probes:", err)
		os.Exit(1)
	}
}

func short(err error) string {
	s := err.Error()
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) && len(ve.Log) > 0 {
		n := len(ve.Log)
		s = strings.Join(ve.Log[max(0, n-2):], " | ")
	}
	s = strings.ReplaceAll(s, "\n", " | ")
	if len(s) > 220 {
		s = s[:217] + "..."
	}
	return s
}

func run(obj, cgroup string) error {
	spec, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		return fmt.Errorf("load %s: %w", obj, err)
	}
	maps := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue
		}
		m, err := ebpf.NewMap(ms)
		if err != nil {
			return fmt.Errorf("map %s: %w", name, err)
		}
		maps[name] = m
	}
	index := map[string]int{
		"kprobe_tcp_sendmsg": 0, "kretprobe_tcp_recvmsg": 1, "fentry_tcp_sendmsg": 2, "fexit_tcp_recvmsg": 3,
		"tp_set_state": 4, "tp_retransmit_skb": 5, "tp_send_reset": 6, "tp_receive_reset": 7,
		"iter_tcp_storage": 8, "iter_unix": 9, "cg_connect_unix": 10, "tp_sock_send_length": 11,
		"kfunc_rdonly_cast": 12, "lsm_socket_connect": 13, "fentry_unix_stream_connect": 14,
	}
	var names []string
	for n := range spec.Programs {
		names = append(names, n)
	}
	sort.Strings(names)
	status := map[string]string{}
	var iters []*link.Iter
	for _, name := range names {
		ps := spec.Programs[name]
		cs := spec.Copy()
		cs.Programs = map[string]*ebpf.ProgramSpec{name: cs.Programs[name]}
		coll, err := ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{MapReplacements: maps})
		if err != nil {
			status[name] = "load=FAIL (" + short(err) + ")"
			continue
		}
		prog := coll.Programs[name]
		var l link.Link
		switch {
		case ps.Type == ebpf.Kprobe && strings.HasPrefix(ps.SectionName, "kretprobe/"):
			l, err = link.Kretprobe(strings.TrimPrefix(ps.SectionName, "kretprobe/"), prog, nil)
		case ps.Type == ebpf.Kprobe:
			l, err = link.Kprobe(strings.TrimPrefix(ps.SectionName, "kprobe/"), prog, nil)
		case ps.Type == ebpf.Tracing && ps.AttachType == ebpf.AttachTraceIter:
			var it *link.Iter
			it, err = link.AttachIter(link.IterOptions{Program: prog})
			if err == nil {
				iters = append(iters, it)
				l = it
			}
		case ps.Type == ebpf.Tracing:
			l, err = link.AttachTracing(link.TracingOptions{Program: prog})
		case ps.Type == ebpf.LSM:
			l, err = link.AttachLSM(link.LSMOptions{Program: prog})
		case ps.Type == ebpf.CGroupSockAddr:
			l, err = link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ps.AttachType, Program: prog})
		default:
			err = fmt.Errorf("no attach rule for type %v", ps.Type)
		}
		if err != nil {
			status[name] = "load=ok attach=FAIL (" + short(err) + ")"
			continue
		}
		defer l.Close()
		status[name] = "load=ok attach=ok"
	}

	traffic()
	closeOpen := openPair()
	for _, it := range iters {
		r, err := it.Open()
		if err == nil {
			_, _ = io.Copy(io.Discard, r)
			_ = r.Close()
		}
	}

	closeOpen()
	for _, name := range names {
		var n uint64
		if i, ok := index[name]; ok {
			_ = maps["hits"].Lookup(uint32(i), &n)
		}
		extra := ""
		if name == "iter_tcp_storage" {
			var s, tp uint64
			_ = maps["hits"].Lookup(uint32(15), &s)
			_ = maps["hits"].Lookup(uint32(16), &tp)
			extra = fmt.Sprintf(" tcp_sock=%d sk_storage_get_ok=%d", tp, s)
		}
		fmt.Printf("PROBE %-28s %s fired=%d%s\n", name, status[name], n, extra)
	}
	var v [5]uint64
	for i := range v {
		_ = maps["vals"].Lookup(uint32(i), &v[i])
	}
	fmt.Printf("PROBE tcp_sock at close (sums): bytes_received=%d bytes_acked=%d bytes_sent=%d total_retrans=%d srtt_us=%d\n", v[0], v[1], v[2], v[3], v[4])
	return nil
}

// traffic makes one echoed loopback TCP exchange, one refused connection and
// one unix stream connection.
func traffic() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("PROBE traffic:", err)
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 1000)
		n, _ := io.ReadFull(c, buf)
		_, _ = c.Write(buf[:n])
		c.Close()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err == nil {
		_, _ = c.Write(make([]byte, 1000))
		_, _ = io.ReadFull(c, make([]byte, 1000))
		c.Close()
	}
	<-done
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
		c.Close()
	}
	p := filepath.Join(os.TempDir(), "probes.sock")
	_ = os.Remove(p)
	if ul, err := net.Listen("unix", p); err == nil {
		go func() {
			if c, err := ul.Accept(); err == nil {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}
		}()
		if c, err := net.Dial("unix", p); err == nil {
			_, _ = c.Write([]byte("hello"))
			c.Close()
		}
		ul.Close()
	}
}

// openPair opens one TCP and one unix stream connection that stay open while
// the iterators run; the returned function closes them.
func openPair() func() {
	var closers []io.Closer
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		closers = append(closers, ln)
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			closers = append(closers, c)
			if s, err := ln.Accept(); err == nil {
				closers = append(closers, s)
				_, _ = c.Write([]byte("ping"))
				_, _ = io.ReadFull(s, make([]byte, 4))
			}
		}
	}
	p := filepath.Join(os.TempDir(), "probes-open.sock")
	_ = os.Remove(p)
	if ul, err := net.Listen("unix", p); err == nil {
		closers = append(closers, ul)
		if c, err := net.Dial("unix", p); err == nil {
			closers = append(closers, c)
			if s, err := ul.Accept(); err == nil {
				closers = append(closers, s)
			}
		}
	}
	return func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}
}
