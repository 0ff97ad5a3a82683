package bundler

import (
	"errors"
	"net"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/testnet"
)

// A connected UDP socket's first datagram counts straight into its flow
// (a one-query socket, as a DNS client's, never pays for storage); one
// that sends again on the same CPU (recent_senders is per CPU) gets
// storage and counts there. The datagrams of both paths add up exactly.
func TestConnectedUDPStorageOnlyForRepeatSenders(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	const port = 5354
	// A sink: without a socket on the port, the ICMP error of one send
	// fails the next.
	b.ListenPacket(t, "udp4", net.JoinHostPort(b.IPv4.String(), "5354"))

	cfg := testConfig()
	cfg.NetNS = a.Inode
	bu := mustLoad(t, cfg)
	defer bu.Close()

	// Every send from one CPU. The thread stays locked: it exits with
	// the test instead of going back to Go's pool pinned.
	runtime.LockOSThread()
	var one unix.CPUSet
	one.Set(0)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}

	c, err := a.Dial("udp4", net.JoinHostPort(b.IPv4.String(), "5354"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	storage := func() (bundlerSockState, bool) {
		var st bundlerSockState
		err := bu.objs.Socks.Lookup(uint32(fd), &st)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return st, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return st, true
	}
	send := func() {
		t.Helper()
		if _, err := c.Write(make([]byte, 25)); err != nil {
			t.Fatal(err)
		}
	}

	send()
	if st, ok := storage(); ok {
		t.Fatalf("a connected socket has storage after its first datagram (%d datagrams counted there), want none", st.UdpDgramsSent)
	}
	const sends = 4
	for i := 2; i <= sends; i++ {
		send()
		st, ok := storage()
		if !ok {
			t.Fatalf("a connected socket has no storage after datagram %d on one CPU, want storage from the second", i)
		}
		if got := st.UdpDgramsSent; got != uint64(i-1) {
			t.Fatalf("after datagram %d, %d counted in the socket's storage, want %d (the first went to the flow)", i, got, i-1)
		}
	}

	// The drain's harvest folds the storage's counts into the flow, beside
	// the first datagram's.
	entries, _, err := bu.Drain()
	if err != nil {
		t.Fatal(err)
	}
	var dgrams, bytes uint64
	for _, e := range entries {
		if e.NetNS == a.Inode && e.Direction == DirOutbound && e.Port == port {
			dgrams += e.DatagramsSent
			bytes += e.BytesSent
		}
	}
	if dgrams != sends || bytes != sends*25 {
		t.Errorf("the client's flow: %d datagrams and %d bytes sent, want %d and %d (%s)", dgrams, bytes, sends, sends*25, lossReport(bu))
	}
}
