package dnswatch_test

// Every way a resolver hands a query to the kernel and takes its answer
// back: the per-call programs find the payload in a different place for
// each system call (a buffer, an iovec array, a msghdr, one message of an
// mmsghdr array), and TCP's length prefix comes in its own buffer or not.
// Each variant the kernel loads must count every one exactly. Needs
// nothing but the kernel.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// answerLookupTCP answers as answerLookup does, over TCP on h's port 53:
// each message a 2-byte length and the message.
func answerLookupTCP(t *testing.T, h *testnet.Host) {
	t.Helper()
	ln := h.Listen(t, "tcp4", net.JoinHostPort(h.IPv4.String(), "53"))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				for {
					var n [2]byte
					if _, err := io.ReadFull(c, n[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(n[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					a := answerTo(q, h)
					if a == nil {
						return
					}
					_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
				}
			}()
		}
	}()
}

func queryOf(t *testing.T, id uint16, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(lookupName), Type: typ, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// dnsSocket opens a blocking socket of typ (in the namespace Do runs
// in), connected to server unless connect is false, with a 5 s receive
// timeout.
func dnsSocket(typ int, server netip4, connect bool) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, typ, 0)
	if err != nil {
		return -1, err
	}
	tv := unix.Timeval{Sec: 5}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if connect {
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: server, Port: 53}); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

type netip4 = [4]byte

// mmsghdr is struct mmsghdr on 64-bit Linux.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// way is one way of sending a query and reading its answer.
type way struct {
	name string
	send func(fd int, q []byte) error
	recv func(fd int) error
}

// lookupEach makes one lookup per way, each on a new socket of typ
// connected to server, with the queries next makes.
func lookupEach(typ int, server netip4, ways []way, next func() []byte) error {
	for _, w := range ways {
		fd, err := dnsSocket(typ, server, true)
		if err != nil {
			return err
		}
		err = w.send(fd, next())
		if err == nil {
			err = retryEINTR(func() error { return w.recv(fd) })
		}
		unix.Close(fd)
		if err != nil {
			return &callError{w.name, err}
		}
	}
	return nil
}

// udpCalls makes one lookup per way of calling, over UDP; it returns how
// many queries it sent.
func udpCalls(t *testing.T, server netip4) (queries int, err error) {
	buf := make([]byte, 1500)
	id := uint16(0x100)
	next := func() []byte { id++; queries++; return queryOf(t, id, dnsmessage.TypeA) }
	ways := []way{
		{"write/read",
			func(fd int, q []byte) error { _, err := unix.Write(fd, q); return err },
			func(fd int) error { _, err := unix.Read(fd, buf); return err }},
		{"send/recv (sendto/recvfrom)",
			func(fd int, q []byte) error { return unix.Sendto(fd, q, 0, nil) },
			func(fd int) error { _, _, err := unix.Recvfrom(fd, buf, 0); return err }},
		{"sendmsg/recvmsg",
			func(fd int, q []byte) error { _, err := unix.SendmsgN(fd, q, nil, nil, 0); return err },
			func(fd int) error { _, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0); return err }},
		{"writev/readv",
			func(fd int, q []byte) error { _, err := unix.Writev(fd, [][]byte{q}); return err },
			func(fd int) error { _, err := unix.Readv(fd, [][]byte{buf}); return err }},
	}
	if err := lookupEach(unix.SOCK_DGRAM, server, ways, next); err != nil {
		return queries, err
	}
	// sendmmsg/recvmmsg: A and AAAA in one call, as glibc asks, and both
	// answers in one call.
	fd, err := dnsSocket(unix.SOCK_DGRAM, server, true)
	if err != nil {
		return queries, err
	}
	defer unix.Close(fd)
	qs := [][]byte{next(), next()}
	var msgs [2]mmsghdr
	var iovs [2]unix.Iovec
	bufs := [2][]byte{make([]byte, 1500), make([]byte, 1500)}
	for i := range msgs {
		iovs[i].Base, iovs[i].Len = &qs[i][0], uint64(len(qs[i]))
		msgs[i].hdr.Iov, msgs[i].hdr.Iovlen = &iovs[i], 1
	}
	if n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), 2, 0, 0, 0); e != 0 || n != 2 {
		return queries, &callError{"sendmmsg", errOf(e, n)}
	}
	for i := range msgs {
		iovs[i].Base, iovs[i].Len = &bufs[i][0], uint64(len(bufs[i]))
	}
	// Blocking, no flags: the call waits for both.
	var n uintptr
	var e unix.Errno
	if err := retryEINTR(func() error {
		n, _, e = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), 2, 0, 0, 0)
		if e != 0 {
			return e
		}
		return nil
	}); err != nil || n != 2 {
		return queries, &callError{"recvmmsg", errOf(e, n)}
	}
	// An unconnected socket, sendto()/recvfrom() with addresses (musl).
	ufd, err := dnsSocket(unix.SOCK_DGRAM, server, false)
	if err != nil {
		return queries, err
	}
	defer unix.Close(ufd)
	if err := unix.Sendto(ufd, next(), 0, &unix.SockaddrInet4{Addr: server, Port: 53}); err != nil {
		return queries, &callError{"unconnected sendto", err}
	}
	if err := retryEINTR(func() error { _, _, err := unix.Recvfrom(ufd, buf, 0); return err }); err != nil {
		return queries, &callError{"unconnected recvfrom", err}
	}
	// The same from a dual-stack IPv6 socket to the v4-mapped address
	// (Java's and Netty's resolvers): the resolver is still the IPv4 one.
	fd6, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
	if err != nil {
		return queries, err
	}
	defer unix.Close(fd6)
	if err := unix.SetsockoptTimeval(fd6, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
		return queries, err
	}
	mapped := [16]byte{10: 0xff, 11: 0xff}
	copy(mapped[12:], server[:])
	if err := unix.Sendto(fd6, next(), 0, &unix.SockaddrInet6{Addr: mapped, Port: 53}); err != nil {
		return queries, &callError{"dual-stack sendto", err}
	}
	if err := retryEINTR(func() error { _, _, err := unix.Recvfrom(fd6, buf, 0); return err }); err != nil {
		return queries, &callError{"dual-stack recvfrom", err}
	}
	return queries, nil
}

// tcpCalls makes one lookup per way of framing over TCP: length and
// message in one buffer; in two buffers of one call (glibc's writev);
// in two calls each way.
func tcpCalls(t *testing.T, server netip4) (queries int, err error) {
	id := uint16(0x200)
	next := func() []byte { id++; queries++; return queryOf(t, id, dnsmessage.TypeA) }
	prefix := func(m []byte) []byte { return binary.BigEndian.AppendUint16(nil, uint16(len(m))) }
	// The answer's length, then the answer: two reads, or one readv of
	// two buffers.
	readSplit := func(fd int) error {
		// Each read retried on its own: the stream must not be read
		// again from the length.
		var n [2]byte
		if err := retryEINTR(func() error { _, err := unix.Read(fd, n[:]); return err }); err != nil {
			return err
		}
		return retryEINTR(func() error { _, err := unix.Read(fd, make([]byte, binary.BigEndian.Uint16(n[:]))); return err })
	}
	readv := func(fd int) error {
		_, err := unix.Readv(fd, [][]byte{make([]byte, 2), make([]byte, 1500)})
		return err
	}
	ways := []way{
		{"tcp: one write, length and message", func(fd int, q []byte) error { _, err := unix.Write(fd, append(prefix(q), q...)); return err }, readv},
		{"tcp: writev of length and message", func(fd int, q []byte) error { _, err := unix.Writev(fd, [][]byte{prefix(q), q}); return err }, readSplit},
		{"tcp: two writes", func(fd int, q []byte) error {
			if _, err := unix.Write(fd, prefix(q)); err != nil {
				return err
			}
			_, err := unix.Write(fd, q)
			return err
		}, readv},
	}
	if err := lookupEach(unix.SOCK_STREAM, server, ways, next); err != nil {
		return queries, err
	}
	return queries, nil
}

type callError struct {
	call string
	err  error
}

func (e *callError) Error() string { return e.call + ": " + e.err.Error() }

func errOf(e unix.Errno, n uintptr) error {
	if e != 0 {
		return e
	}
	return fmt.Errorf("moved %d of 2 messages", n)
}

// refusedPerCall fails the test when the kernel has the tracepoints the
// per-call variant needs but refused it (err), and logs the refusal
// otherwise (a kernel before 6.3).
func refusedPerCall(t *testing.T, err error) {
	t.Helper()
	kspec, kerr := btf.LoadKernelSpec()
	if kerr != nil {
		t.Fatalf("kernel BTF: %v", kerr)
	}
	if _, noTP := kspec.AnyTypeByName("btf_trace_sock_send_length"); noTP == nil {
		t.Fatalf("the kernel has sock_send_length, but the per-call variant does not load: %v", err)
	}
	t.Logf("the per-call variant refused here (a kernel without sock_send_length): %v", err)
}

// TestEveryCallPath: each variant the kernel loads counts a lookup made
// through each system call exactly, with the calling process, and the
// per-call variant loads wherever the kernel has its tracepoints: on its
// own, and (the default, "tracer") handed the calls by the tracer's send
// and receive programs.
func TestEveryCallPath(t *testing.T) {
	testnet.RequireRoot(t)
	type way struct {
		name    string
		variant string // "" with the tracer: what trace and agent load
		tracer  bool
		perCall bool
	}
	ways := []way{{name: "tracer", tracer: true, perCall: true}}
	for _, v := range dnswatch.Variants {
		ways = append(ways, way{name: v.Name, variant: v.Name, perCall: v.PerCall})
		if !v.PerCall {
			// What trace loads before 6.3: reading the tracer's notes.
			ways = append(ways, way{name: v.Name + "+tracer", variant: v.Name, tracer: true})
		}
	}
	// One tracer for every way that runs with one: loading it costs a
	// minute under emulation. It traces every namespace, as the hand-off
	// and the resolver notes do anyway; each watcher keeps to its own
	// client's namespace, and each handed-off watcher must leave the
	// arrays empty for the next.
	tr, trErr := tracer.New(tracertest.Config(nil))
	if trErr == nil {
		defer tr.Close()
	}
	loadsAlone := map[string]bool{} // variants that loaded without a tracer
	for _, v := range ways {
		t.Run(v.name, func(t *testing.T) {
			client, srv := resolverPair(t)
			cfg := dnswatch.DefaultConfig()
			cfg.Variant = v.variant
			cfg.NetNS = client.Inode // the machine's own lookups are not this test's
			if v.tracer {
				if trErr != nil {
					tracerRefused(t, trErr)
					return
				}
				cfg.Calls = tr
			}
			w, err := dnswatch.New(cfg)
			if err != nil {
				switch {
				case v.perCall:
					refusedPerCall(t, err)
				case v.tracer && loadsAlone[v.variant]:
					// Only the tracer's notes differ: they must load.
					t.Errorf("variant %s loads alone but not with the tracer's resolver notes: %v", v.variant, err)
				default:
					t.Logf("variant %s refused here: %v", v.name, err)
				}
				return
			}
			defer w.Close()
			if !v.tracer {
				loadsAlone[v.variant] = true
			}
			if v.tracer && v.variant == "" && !w.HandedOff() {
				// What trace loads where the tracer has no send and
				// receive tracepoints: a per-packet variant, tested too.
				refusedPerCall(t, fmt.Errorf("loaded %s, not the per-call programs in the tracer's calls (%v)", w.Variant().Name, w.HandOffRefused()))
			}
			// With the tracer, every variant reads the notes of the
			// tracer's sendmsg programs: no second program on those
			// hooks. On its own it notes resolvers itself.
			var tracerNotes bool
			if v.tracer {
				_, _, dests, _ := tr.DNSCallHooks()
				tracerNotes = dests != nil
				if sendmsg := hooksActive(tr, "udp_sendmsg4", "udp_sendmsg6"); tracerNotes != sendmsg {
					t.Errorf("the tracer offers resolver notes: %v; want %v, whether its sendmsg programs are attached", tracerNotes, sendmsg)
				}
			}
			if want := !tracerNotes && w.Variant().NotesLost == ""; w.OwnNotes() != want {
				t.Errorf("the watcher's own sendmsg programs loaded: %v; want %v (the tracer's notes: %v, handed its calls: %v)", w.OwnNotes(), want, tracerNotes, w.HandedOff())
			}
			lookupEveryWay(t, w, client, srv)
			if t.Failed() && v.tracer {
				// What the tracer's copies lost or rescued (a call the
				// kernel skipped in every copy never reaches the watcher),
				// to tell such a loss from the watcher's own.
				st, err := tr.Stats()
				t.Logf("tracer stats %+v (err %v); watcher stats %+v", st, err, w.Stats())
			}
			if v.tracer && w.HandedOff() {
				// Closed, the watcher takes its programs back out.
				if err := w.Close(); err != nil {
					t.Errorf("close the watcher: %v", err)
				}
				send, recv, _, _ := tr.DNSCallHooks()
				emptyCalls(t, send, recv)
			}
		})
	}
}

// hooksActive says whether every one of the tracer's programs named is
// attached.
func hooksActive(tr *tracer.Tracer, programs ...string) bool {
	for _, p := range programs {
		if !slices.ContainsFunc(tr.Hooks(), func(h tracer.Hook) bool { return h.Program == p && h.Active }) {
			return false
		}
	}
	return true
}

// emptyCalls fails the test unless the tracer's program arrays are empty.
func emptyCalls(t *testing.T, calls ...*ebpf.Map) {
	t.Helper()
	for _, m := range calls {
		var id uint32
		if err := m.Lookup(uint32(0), &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("program array %s holds program %d (%v); want it empty", m, id, err)
		}
	}
}

// refusingCalls offers program arrays of which the kernel takes the
// per-call send program and refuses the receive one: the receive array's
// owner is a socket filter's (a kernel's rule on tail calls refusing a
// program looks the same to the watcher).
type refusingCalls struct{ send, recv *ebpf.Map }

// The watcher notes resolvers itself (dests nil).
func (r refusingCalls) DNSCallHooks() (send, recv, dests *ebpf.Map, ok bool) {
	return r.send, r.recv, nil, true
}

func newRefusingCalls(t *testing.T) refusingCalls {
	t.Helper()
	filter, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatalf("socket filter: %v", err)
	}
	defer filter.Close()
	var arrays [2]*ebpf.Map
	for i := range arrays {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatalf("program array: %v", err)
		}
		t.Cleanup(func() { m.Close() })
		arrays[i] = m
		if i == 0 {
			continue // the send array takes any first program
		}
		// The first program put in an array makes its owner's type.
		if err := m.Put(uint32(0), filter); err != nil {
			t.Fatalf("put the socket filter: %v", err)
		}
		if err := m.Delete(uint32(0)); err != nil {
			t.Fatalf("take the socket filter out: %v", err)
		}
	}
	return refusingCalls{arrays[0], arrays[1]}
}

// TestHandOffRefusedFallsBack: when the kernel will not take the per-call
// programs into the tracer's arrays (here the second of the two), the
// watcher takes out what it put, says why and watches packets instead,
// counting the same lookups exactly.
func TestHandOffRefusedFallsBack(t *testing.T) {
	testnet.RequireRoot(t)
	client, srv := resolverPair(t)
	calls := newRefusingCalls(t)
	cfg := dnswatch.DefaultConfig()
	cfg.NetNS, cfg.Calls = client.Inode, calls
	w, err := dnswatch.New(cfg)
	if err != nil {
		t.Fatalf("the watcher did not fall back to a per-packet variant: %v", err)
	}
	defer w.Close()
	if w.HandedOff() || w.Variant().PerCall {
		t.Fatalf("variant %s, handed off %t; want a per-packet variant", w.Variant().Name, w.HandedOff())
	}
	if w.HandOffRefused() == nil {
		refusedPerCall(t, errors.New("no hand-over refusal: the per-call variant did not load"))
	} else {
		t.Logf("refused, as wanted: %v", w.HandOffRefused())
	}
	emptyCalls(t, calls.send, calls.recv) // the send program taken back out
	lookupEveryWay(t, w, client, srv)
}

// resolverPair makes a client and a resolver (srv, answering over UDP and
// TCP on port 53) in two test namespaces.
func resolverPair(t *testing.T) (client, srv *testnet.Host) {
	t.Helper()
	nw := testnet.New(t, 2)
	client, srv = nw.Hosts[0], nw.Hosts[1]
	answerLookup(t, srv)
	answerLookupTCP(t, srv)
	return client, srv
}

// lookupEveryWay makes a lookup from client through srv's resolver by
// each way of udpCalls and tcpCalls, then checks w counted each exactly
// (expectLookups).
func lookupEveryWay(t *testing.T, w *dnswatch.Watcher, client, srv *testnet.Host) {
	t.Helper()
	server := [4]byte(srv.IPv4.To4())
	var udpQ, tcpQ int
	client.Do(t, func() (err error) {
		if udpQ, err = udpCalls(t, server); err != nil {
			return err
		}
		tcpQ, err = tcpCalls(t, server)
		return err
	})
	expectLookups(t, w, client, srv, udpQ, tcpQ)
}

// expectLookups waits (at most 10 s) for w to count udpQ lookups over UDP
// and tcpQ over TCP that this process made from client through srv's
// resolver, then checks those counts exactly, and that nothing else was
// counted, lost, unparsed or unreadable.
func expectLookups(t *testing.T, w *dnswatch.Watcher, client, srv *testnet.Host, udpQ, tcpQ int) {
	t.Helper()
	resolver := srv.IPv4.String() + ":53"
	pid := uint32(os.Getpid())
	if w.Variant().Lost != "" {
		pid = 0 // a variant that cannot see the process
	}
	got := map[tracer.Proto]tracer.DNSCounters{}
	var other []tracer.DNS
	deadline := time.Now().Add(10 * time.Second)
	for {
		iv := tracer.Interval{Time: time.Now()}
		w.Apply(&iv)
		for _, d := range iv.DNS {
			if d.NetNS != client.Inode || d.Resolver != resolver || d.PID != pid {
				other = append(other, d)
				continue
			}
			c := got[d.Proto]
			c.Add(d.DNSCounters)
			got[d.Proto] = c
		}
		if got[tracer.ProtoUDP].Answers >= uint64(udpQ) && got[tracer.ProtoTCP].Answers >= uint64(tcpQ) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for proto, n := range map[tracer.Proto]int{tracer.ProtoUDP: udpQ, tracer.ProtoTCP: tcpQ} {
		c := got[proto]
		c.LatencySumUs, c.LatencyMaxUs = 0, 0
		want := tracer.DNSCounters{Queries: uint64(n), Answers: uint64(n), NoError: uint64(n), LatencyCount: uint64(n)}
		if c != want {
			t.Errorf("%s lookups of this process through %s: %+v; want %+v", proto, resolver, c, want)
		}
	}
	if len(other) > 0 {
		t.Errorf("records of another client, resolver or process: %+v", other)
	}
	// Lost and Unreadable are the kernel side's, of every namespace: the
	// test's lookups are the only DNS of a quiet machine.
	if st := w.Stats(); st.Lost != 0 || st.Unparsed != 0 || st.Unreadable != 0 {
		t.Errorf("watcher stats %+v; want nothing lost, unparsed or unreadable", st)
	}
}

// tracerRefused fails the test unless the kernel predates what the tracer
// needs (5.12; the DNS watcher alone loads on 5.10).
func tracerRefused(t *testing.T, err error) {
	t.Helper()
	if kernel.ReleaseAtLeast(5, 12) {
		t.Fatalf("load tracer: %v", err)
	}
	t.Logf("the tracer refused here (a kernel before 5.12): %v", err)
}

// TestHandOffAcrossAdoption: a pinned kernel side keeps the DNS program
// arrays its send and receive programs tail-call through; the next
// process's tracer adopts them and empties what its predecessor's watcher
// left there (no one reads that watcher's records any more), its own
// watcher is handed the calls, and the old watcher's late close leaves
// the new one's programs in place.
func TestHandOffAcrossAdoption(t *testing.T) {
	testnet.RequireRoot(t)
	client, srv := resolverPair(t)
	pin := filepath.Join(filepath.Dir(tracer.DefaultPinPath), fmt.Sprintf("deptrace-test-%d-dns", os.Getpid()))
	t.Cleanup(func() { _, _ = tracer.Cleanup(pin) })
	tcfg := tracertest.Config(func(c *tracer.Config) { c.NetNS, c.PinPath = client.Inode, pin })
	first, err := tracer.New(tcfg)
	if err != nil {
		tracerRefused(t, err)
		return
	}
	released := false
	defer func() {
		if !released {
			first.Close() // unpins: the cleanup above cannot while it holds the lock
		}
	}()
	if _, _, _, ok := first.DNSCallHooks(); !ok {
		refusedPerCall(t, errors.New("the tracer has no send and receive tracepoint programs"))
		return
	}
	cfg := dnswatch.DefaultConfig()
	cfg.NetNS, cfg.Calls = client.Inode, first
	old, err := dnswatch.New(cfg)
	if err != nil {
		t.Fatalf("first watcher: %v", err)
	}
	oldOpen := true
	defer func() {
		if oldOpen {
			old.Close()
		}
	}()
	first.Release() // its process ends; the side stays counting, old's programs in its arrays
	released = true

	second, err := tracer.New(tcfg)
	if err != nil {
		t.Fatalf("adopt the pinned side: %v", err)
	}
	defer second.Close()
	if !second.Adoption().Adopted {
		t.Fatalf("the pinned side was not adopted: %+v", second.Adoption())
	}
	send, recv, _, ok := second.DNSCallHooks()
	if !ok {
		t.Fatal("the adopted side has no DNS call hooks")
	}
	emptyCalls(t, send, recv) // the dead watcher's programs are out
	cfg.Calls = second
	w, err := dnswatch.New(cfg)
	if err != nil {
		t.Fatalf("second watcher: %v", err)
	}
	defer w.Close()
	if !w.HandedOff() {
		t.Fatalf("second watcher loaded %s, not the per-call programs in the tracer's calls", w.Variant().Name)
	}
	oldOpen = false
	if err := old.Close(); err != nil {
		t.Errorf("close the first watcher: %v", err)
	}
	lookupEveryWay(t, w, client, srv)
}

// TestUnreadableCallIsCounted: a query the per-call programs cannot read
// (sent by sendfile() from a file: no buffer of the caller's to read, as
// with io_uring) is counted unreadable and unparsed for its client, not
// lost without a trace; its answer, read with recv(), counts as an answer
// whose query was not seen.
func TestUnreadableCallIsCounted(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	client, srv := nw.Hosts[0], nw.Hosts[1]
	answerLookup(t, srv)
	cfg := dnswatch.DefaultConfig()
	cfg.Variant = "call"
	cfg.NetNS = client.Inode
	w, err := dnswatch.New(cfg)
	if err != nil {
		refusedPerCall(t, err)
		return
	}
	defer w.Close()
	file := filepath.Join(t.TempDir(), "query")
	if err := os.WriteFile(file, queryOf(t, 0x300, dnsmessage.TypeA), 0o600); err != nil {
		t.Fatal(err)
	}
	client.Do(t, func() error {
		fd, err := dnsSocket(unix.SOCK_DGRAM, [4]byte(srv.IPv4.To4()), true)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := unix.Sendfile(fd, int(f.Fd()), nil, 1500); err != nil {
			return &callError{"sendfile", err}
		}
		return retryEINTR(func() error { _, _, err := unix.Recvfrom(fd, make([]byte, 1500), 0); return err })
	})
	var got tracer.DNSCounters
	deadline := time.Now().Add(10 * time.Second)
	for got.Answers == 0 && time.Now().Before(deadline) {
		iv := tracer.Interval{Time: time.Now()}
		w.Apply(&iv)
		for _, d := range iv.DNS {
			if d.NetNS == client.Inode {
				got.Add(d.DNSCounters)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	got.LatencySumUs, got.LatencyMaxUs = 0, 0
	// Before 6.5 sendfile() reaches a UDP socket through sendpage, which
	// does not run sock_send_length: the query is not seen at all.
	want, unreadable := tracer.DNSCounters{Answers: 1, NoError: 1, Unparsed: 1}, uint64(1)
	if !kernel.ReleaseAtLeast(6, 5) {
		want, unreadable = tracer.DNSCounters{Answers: 1, NoError: 1}, 0
	}
	if got != want {
		t.Errorf("the client's lookups: %+v; want %+v", got, want)
	}
	if st := w.Stats(); st.Unreadable != unreadable || st.Unparsed != want.Unparsed {
		t.Errorf("watcher stats %+v; want %d unreadable, %d unparsed", st, unreadable, want.Unparsed)
	}
}

// retryEINTR repeats a blocking receive that a signal interrupted before
// anything arrived: the test's sockets carry SO_RCVTIMEO, so the kernel
// does not restart such a call after the Go runtime's preemption signal
// (SIGURG), and returns EINTR instead. Bounded: a receive that keeps
// being interrupted fails.
func retryEINTR(recv func() error) error {
	for i := 0; ; i++ {
		err := recv()
		if !errors.Is(err, unix.EINTR) || i == 100 {
			return err
		}
	}
}
