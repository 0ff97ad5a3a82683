package tracer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// unixSocket makes a unix socket of the given type, closed with the test.
func unixSocket(t *testing.T, typ int) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, typ|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	return fd
}

// unixConnect connects a new socket of typ to path and returns connect's error.
func unixConnect(t *testing.T, typ int, path string) error {
	fd := unixSocket(t, typ)
	return syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
}

// Unix connects that fail in connect() itself are failed connections of
// the client's flow to that path, by cause; none is a connection.
func TestFailedUnixConnects(t *testing.T) {
	tr := startSharedTracer(t)
	dir := t.TempDir()

	// No socket at the path.
	missing := filepath.Join(dir, "missing.sock")
	// A socket bound there that does not listen.
	deaf := filepath.Join(dir, "deaf.sock")
	if err := syscall.Bind(unixSocket(t, syscall.SOCK_STREAM), &syscall.SockaddrUnix{Name: deaf}); err != nil {
		t.Fatal(err)
	}
	// A listener whose backlog (0) is full after one connection, that
	// never accepts: non-blocking connects get EAGAIN.
	full := filepath.Join(dir, "full.sock")
	lfd := unixSocket(t, syscall.SOCK_STREAM)
	if err := syscall.Bind(lfd, &syscall.SockaddrUnix{Name: full}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(lfd, 0); err != nil {
		t.Fatal(err)
	}
	// An abstract name nobody holds.
	abstract := fmt.Sprintf("@deptrace-nobody-%d", os.Getpid())

	want := map[string]syscall.Errno{missing: syscall.ENOENT, deaf: syscall.ECONNREFUSED, abstract: syscall.ECONNREFUSED}
	const tries = 3
	for path, errno := range want {
		for i := 0; i < tries; i++ {
			if err := unixConnect(t, syscall.SOCK_STREAM, path); !errors.Is(err, errno) {
				t.Fatalf("connect %s: %v, want %v", path, err, errno)
			}
		}
	}
	if err := unixConnect(t, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK, full); err != nil {
		t.Fatalf("first connect to the listener: %v", err)
	}
	for i := 0; i < tries; i++ {
		if err := unixConnect(t, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK, full); !errors.Is(err, syscall.EAGAIN) {
			t.Fatalf("connect to the full listener: %v, want EAGAIN", err)
		}
	}
	// A datagram socket's connect to a missing path fails the same way.
	dgramMissing := filepath.Join(dir, "nolog")
	if err := unixConnect(t, syscall.SOCK_DGRAM, dgramMissing); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("datagram connect: %v, want ENOENT", err)
	}

	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		for path := range want {
			if o, _ := unixFlows(l, path); o.FailedConnections < tries {
				return false
			}
		}
		o, _ := unixFlows(l, full)
		d, _ := unixFlows(l, dgramMissing)
		return o.FailedConnections >= tries && d.FailedConnections >= 1
	})
	for path := range want {
		o, in := unixFlows(l, path)
		if !l.Counted(o.FailedConnections, tries) || !l.Counted(o.FailedRefused, tries) || o.Connections != 0 {
			t.Errorf("%s: %+v; want %d failed, all refused, no connection", path, o.Counters, tries)
		}
		if o.Comm != testComm() || o.PID != uint32(os.Getpid()) {
			t.Errorf("%s: failures named %d/%q, want the test's %d/%q", path, o.PID, o.Comm, os.Getpid(), testComm())
		}
		if in.Connections != 0 || in.FailedConnections != 0 {
			t.Errorf("%s: a server side for a failed connect: %+v", path, in.Counters)
		}
	}
	if o, _ := unixFlows(l, full); !l.Counted(o.FailedConnections, tries) || !l.Counted(o.FailedTimeout, tries) {
		t.Errorf("full backlog: %+v; want %d failed, all timeout", o.Counters, tries)
	}
	if d, _ := unixFlows(l, dgramMissing); !l.Counted(d.FailedConnections, 1) || !l.Counted(d.FailedRefused, 1) {
		t.Errorf("datagram connect: %+v; want 1 failed, refused", d.Counters)
	}
}

// A TCP connect that fails before any SYN (the route rejects it) is a
// failed connection by cause, although no socket state changes. The routes
// are inside the test's own namespace and reject locally: nothing is sent.
// A blocking connect to an address of the test's own network that no host
// answers fails after its SYN (address resolution fails: EHOSTUNREACH), and
// is counted once, at SYN_SENT -> CLOSE, not again at connect()'s return.
func TestTCPConnectsFailingBeforeAnySYN(t *testing.T) {
	nw := testnet.New(t, 1)
	a := nw.Hosts[0]
	nobody := net.IPv4(198, 51, 100, 250).To4() // in the test network's /24; no host has it
	// One neighbour probe, 100 ms: the failure comes in a fraction of a second.
	a.Do(t, func() error {
		for file, v := range map[string]string{"mcast_solicit": "1", "retrans_time_ms": "100"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/neigh/eth0/"+file, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	for _, args := range [][]string{
		{"route", "add", "unreachable", "203.0.113.0/25"},
		{"route", "add", "prohibit", "203.0.113.128/25"},
	} {
		if out, err := a.Command(context.Background(), "ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	tr := startSharedTracer(t)
	const tries = 2
	want := map[string]syscall.Errno{"203.0.113.1": syscall.EHOSTUNREACH, "203.0.113.129": syscall.EACCES}
	for ip, errno := range want {
		for i := 0; i < tries; i++ {
			c, err := a.Dial("tcp4", ip+":80")
			if err == nil {
				c.Close()
				t.Fatalf("connect to %s succeeded", ip)
			}
			if !errors.Is(err, errno) {
				t.Fatalf("connect to %s: %v, want %v", ip, err, errno)
			}
		}
	}
	for i := 0; i < tries; i++ {
		var err error
		a.Do(t, func() error {
			fd, serr := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if serr != nil {
				return serr
			}
			defer syscall.Close(fd)
			sa := &syscall.SockaddrInet4{Port: 82}
			copy(sa.Addr[:], nobody)
			err = syscall.Connect(fd, sa) // blocking
			return nil
		})
		if !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Fatalf("blocking connect to an address nobody has: %v, want EHOSTUNREACH", err)
		}
	}
	find := func(l *tracertest.Ledger, ip string, port uint16) tracer.Flow {
		for _, f := range l.Flows {
			if f.NetNS == a.Inode && f.Proto == "tcp" && f.Direction == tracer.Outbound && f.RemoteAddr == ip && f.Port == port {
				return *f
			}
		}
		return tracer.Flow{}
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		return find(l, "203.0.113.1", 80).FailedConnections >= tries && find(l, "203.0.113.129", 80).FailedConnections >= tries &&
			find(l, nobody.String(), 82).FailedConnections >= tries
	})
	// Counted twice, the second count would have no local address: a flow
	// of its own. Sum every flow to that address.
	var failed, unreachable, flows uint64
	for _, f := range l.Flows {
		if f.NetNS == a.Inode && f.Proto == "tcp" && f.RemoteAddr == nobody.String() && f.Port == 82 {
			flows++
			failed += f.FailedConnections
			unreachable += f.FailedUnreachable
		}
	}
	if flows != 1 || failed != tries || unreachable != tries {
		t.Errorf("blocking connect failing after its SYN: %d flows, %d failed (%d unreachable); want 1 flow, %d failed, all unreachable, each counted once", flows, failed, unreachable, tries)
	}
	for ip := range want {
		f := find(l, ip, 80)
		if !l.Counted(f.FailedConnections, tries) || !l.Counted(f.FailedUnreachable, tries) || f.Connections != 0 || f.Retransmits != 0 {
			t.Errorf("%s: %+v; want %d failed, all unreachable", ip, f.Counters, tries)
		}
		if f.Comm != testComm() {
			t.Errorf("%s: named %q, want %q", ip, f.Comm, testComm())
		}
	}
}
