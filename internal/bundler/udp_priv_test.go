package bundler

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/testnet"
)

// A connected UDP socket's first datagram counts straight into its flow
// (a one-query socket, as a DNS client's, never pays for storage); one
// that sends again on the same CPU (recent_senders is per CPU) gets
// storage and counts there; a new socket to the same peer is new again.
// The datagrams of both paths add up exactly.
func TestConnectedUDPStorageOnlyForRepeatSenders(t *testing.T) {
	testnet.RequireRoot(t)
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	const port = 5354
	server := net.JoinHostPort(b.IPv4.String(), strconv.Itoa(port))
	// A sink: without a socket on the port, the ICMP error of one send
	// fails the next.
	b.ListenPacket(t, "udp4", server)

	cfg := testConfig()
	cfg.NetNS = a.Inode
	bu := mustLoad(t, cfg)
	defer bu.Close()

	// Every send from one CPU, the first this thread may use. The thread
	// stays locked: it exits with the test instead of going back to Go's
	// pool pinned.
	runtime.LockOSThread()
	var allowed, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !allowed.IsSet(cpu) {
		cpu++
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}

	// Each socket's local port chosen here, through the namespace's
	// ephemeral range: the second socket's differs from the first's by
	// 2^14, a difference only a hash's top bits tell apart. The range is
	// left at the last port (the namespace goes with the test); a range
	// of one even port makes the kernel log a parity warning, harmless.
	dial := func(localPort int) (net.Conn, int) {
		t.Helper()
		var c net.Conn
		a.Do(t, func() (err error) {
			r := fmt.Sprintf("%d %d", localPort, localPort)
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte(r), 0o644); err != nil {
				return err
			}
			c, err = net.Dial("udp4", server)
			return err
		})
		if got := c.LocalAddr().(*net.UDPAddr).Port; got != localPort {
			t.Fatalf("the client socket got port %d, want %d", got, localPort)
		}
		t.Cleanup(func() { c.Close() })
		raw, err := c.(*net.UDPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var fd int
		if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
			t.Fatal(err)
		}
		return c, fd // the fd stays the socket's while c is open
	}
	storage := func(fd int) (bundlerSockState, bool) {
		t.Helper()
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
	send := func(c net.Conn) {
		t.Helper()
		if _, err := c.Write(make([]byte, 25)); err != nil {
			t.Fatal(err)
		}
	}

	c, fd := dial(40000)
	send(c)
	if st, ok := storage(fd); ok {
		t.Fatalf("a connected socket has storage after its first datagram (%d datagrams counted there), want none", st.UdpDgramsSent)
	}
	const sends = 4
	for i := 2; i <= sends; i++ {
		send(c)
		st, ok := storage(fd)
		if !ok {
			t.Fatalf("a connected socket has no storage after datagram %d on one CPU, want storage from the second", i)
		}
		if got := st.UdpDgramsSent; got != uint64(i-1) {
			t.Fatalf("after datagram %d, %d counted in the socket's storage, want %d (the first went to the flow)", i, got, i-1)
		}
	}

	// Another socket to the same peer, from the same CPU: its first
	// datagram is its own, not taken for the repeat sender's.
	c2, fd2 := dial(40000 + 1<<14)
	send(c2)
	if st, ok := storage(fd2); ok {
		t.Fatalf("a second socket to the same peer has storage after its first datagram (%d counted there), want none", st.UdpDgramsSent)
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
	if want := uint64(sends + 1); dgrams != want || bytes != want*25 {
		t.Errorf("the client's flow: %d datagrams and %d bytes sent, want %d and %d (%s)", dgrams, bytes, want, want*25, lossReport(bu))
	}
}
