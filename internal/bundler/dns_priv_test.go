package bundler

import (
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
)

// dnsDest is struct dns_dest (bpf/dns.h).
type dnsDest struct {
	Addr    [16]byte
	Pending uint32
	Asked   uint32
	Family  uint32
}

// countingCall loads a program for the send or receive tracepoint that
// counts this process's runs in counts[key]: put in the tracer's DNS
// program arrays in place of the watcher's, it counts the calls the
// tracer hands over from this test (other tests' and the host's lookups
// are handed over too, in their own processes).
func countingCall(t *testing.T, tracepoint string, counts *ebpf.Map, key int32) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Tracing, AttachType: ebpf.AttachTraceRawTp, AttachTo: tracepoint, License: "GPL",
		Instructions: asm.Instructions{
			asm.FnGetCurrentPidTgid.Call(),
			asm.RSh.Imm(asm.R0, 32),
			asm.JNE.Imm(asm.R0, int32(os.Getpid()), "out"),
			asm.StoreImm(asm.RFP, -4, int64(key), asm.Word),
			asm.LoadMapPtr(asm.R1, counts.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("counting program for %s: %v", tracepoint, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestDNSHandOffOnlyResolverSockets: the send and receive programs hand
// the DNS watcher the calls of a socket connected to port 53 and of an
// unconnected UDP socket whose last sendto() went to port 53, whose
// resolver the tracer's sendmsg programs note (dns_dests, both families), and no other
// socket's calls: not an unconnected socket that sends elsewhere (a
// syslog or statsd client, a DNS server answering), nor one that asked a
// resolver once and then sent elsewhere, whose note is forgotten.
func TestDNSHandOffOnlyResolverSockets(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	resolver := b.ListenPacket(t, "udp4", net.JoinHostPort(b.IPv4.String(), "53"))
	other := b.ListenPacket(t, "udp4", net.JoinHostPort(b.IPv4.String(), "5354"))

	cfg := testConfig()
	cfg.NetNS = a.Inode
	bu := mustLoad(t, cfg)
	defer bu.Close()
	send, recv, dests, ok := bu.DNSCallHooks()
	if !ok {
		if kernel.Has("btf_trace_sock_send_length") {
			t.Fatalf("the kernel has sock_send_length, but the tracer offers no DNS call hooks")
		}
		t.Logf("no DNS call hooks here (a kernel without sock_send_length): nothing hands calls over")
		return
	}
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer counts.Close()
	const sends, recvs = int32(0), int32(1)
	if err := send.Put(uint32(0), countingCall(t, "sock_send_length", counts, sends)); err != nil {
		t.Fatalf("put the counting program in %s: %v", send, err)
	}
	if err := recv.Put(uint32(0), countingCall(t, "sock_recv_length", counts, recvs)); err != nil {
		t.Fatalf("put the counting program in %s: %v", recv, err)
	}
	handed := func() (s, r uint64) {
		t.Helper()
		if err := counts.Lookup(sends, &s); err != nil {
			t.Fatal(err)
		}
		if err := counts.Lookup(recvs, &r); err != nil {
			t.Fatal(err)
		}
		return s, r
	}

	var fd int
	a.Do(t, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		return err
	})
	defer unix.Close(fd)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
		t.Fatal(err)
	}
	var bAddr [4]byte
	copy(bAddr[:], b.IPv4.To4())
	sendTo := func(port, n int) {
		t.Helper()
		for range n {
			if err := unix.Sendto(fd, []byte("datagram"), 0, &unix.SockaddrInet4{Port: port, Addr: bAddr}); err != nil {
				t.Fatalf("sendto port %d: %v", port, err)
			}
		}
	}
	// answer sends a datagram from pc to the client socket, which reads it.
	answer := func(pc net.PacketConn) {
		t.Helper()
		sa, err := unix.Getsockname(fd)
		if err != nil {
			t.Fatal(err)
		}
		port := sa.(*unix.SockaddrInet4).Port
		if err := pc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := pc.WriteTo([]byte("answer"), &net.UDPAddr{IP: a.IPv4, Port: port}); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if _, _, err := unix.Recvfrom(fd, buf, 0); err != nil {
			t.Fatalf("recvfrom: %v", err)
		}
	}
	note := func() (d dnsDest, ok bool) {
		t.Helper()
		return d, dests.Lookup(int32(fd), &d) == nil
	}
	expect := func(step string, wantSend, wantRecv uint64) {
		t.Helper()
		if s, r := handed(); s != wantSend || r != wantRecv {
			t.Errorf("%s: handed over %d sends and %d receives; want %d and %d", step, s, r, wantSend, wantRecv)
		}
	}

	// An unconnected socket sending elsewhere has the tracer's storage
	// (its peers are noted per datagram) but is never handed over.
	sendTo(5354, 20)
	answer(other)
	expect("sendto port 5354", 0, 0)
	if _, ok := note(); ok {
		t.Errorf("a socket that never sent to port 53 has a resolver note")
	}

	// A query: noted (the counting program does not take the note, as
	// the watcher's would), its send and the answer handed over.
	sendTo(53, 1)
	d, ok := note()
	if !ok || d.Pending != 1 || d.Family != 4 || [4]byte(d.Addr[:4]) != bAddr {
		t.Errorf("after a sendto to port 53 the note is %+v (found %v); want pending, family 4, address %v", d, ok, b.IPv4)
	}
	expect("sendto port 53", 1, 0)
	answer(resolver)
	expect("the answer", 1, 1)

	// Sending elsewhere again: the note is forgotten, nothing handed.
	// The watcher's send program would have taken the note (pending to
	// asked); so does the test, so that forgetting asked is checked too.
	d.Pending, d.Asked = 0, 1
	if err := dests.Update(int32(fd), d, ebpf.UpdateExist); err != nil {
		t.Fatalf("take the note as the watcher does: %v", err)
	}
	sendTo(5354, 5)
	answer(other)
	expect("sendto port 5354 after a query", 1, 1)
	if d, ok := note(); !ok || d.Pending != 0 || d.Asked != 0 {
		t.Errorf("after a sendto elsewhere the note is %+v (found %v); want it forgotten", d, ok)
	}

	// Connected sockets: by their remote port alone.
	for _, c := range []struct {
		port     int
		wantSend uint64
	}{{5354, 1}, {53, 2}} {
		conn, err := a.Dial("udp4", net.JoinHostPort(b.IPv4.String(), strconv.Itoa(c.port)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte("datagram")); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		expect("a socket connected to port "+strconv.Itoa(c.port), c.wantSend, 1)
	}

	// IPv6 (udp_sendmsg6): the note holds the whole address, family 6.
	resolver6 := b.ListenPacket(t, "udp6", net.JoinHostPort(b.IPv6.String(), "53"))
	var fd6 int
	a.Do(t, func() (err error) {
		fd6, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
		return err
	})
	defer unix.Close(fd6)
	if err := unix.SetsockoptTimeval(fd6, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
		t.Fatal(err)
	}
	var bAddr6 [16]byte
	copy(bAddr6[:], b.IPv6.To16())
	if err := unix.Sendto(fd6, []byte("query"), 0, &unix.SockaddrInet6{Port: 53, Addr: bAddr6}); err != nil {
		t.Fatalf("sendto [%v]:53: %v", b.IPv6, err)
	}
	var d6 dnsDest
	if err := dests.Lookup(int32(fd6), &d6); err != nil || d6.Pending != 1 || d6.Family != 6 || d6.Addr != bAddr6 {
		t.Errorf("after an IPv6 sendto to port 53 the note is %+v (%v); want pending, family 6, address %v", d6, err, b.IPv6)
	}
	expect("IPv6 sendto port 53", 3, 1)
	sa, err := unix.Getsockname(fd6)
	if err != nil {
		t.Fatal(err)
	}
	if err := resolver6.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := resolver6.WriteTo([]byte("answer"), &net.UDPAddr{IP: a.IPv6, Port: sa.(*unix.SockaddrInet6).Port}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := unix.Recvfrom(fd6, make([]byte, 64), 0); err != nil {
		t.Fatalf("recvfrom on the IPv6 socket: %v", err)
	}
	expect("the IPv6 answer", 3, 2)
	d6.Pending, d6.Asked = 0, 1 // taken, as the watcher's send program would
	if err := dests.Update(int32(fd6), d6, ebpf.UpdateExist); err != nil {
		t.Fatalf("take the IPv6 note as the watcher does: %v", err)
	}
	if err := unix.Sendto(fd6, []byte("datagram"), 0, &unix.SockaddrInet6{Port: 5354, Addr: bAddr6}); err != nil {
		t.Fatalf("sendto [%v]:5354: %v", b.IPv6, err)
	}
	expect("IPv6 sendto port 5354 after a query", 3, 2)
	if err := dests.Lookup(int32(fd6), &d6); err != nil || d6.Pending != 0 || d6.Asked != 0 {
		t.Errorf("after an IPv6 sendto elsewhere the note is %+v (%v); want it forgotten", d6, err)
	}
}
