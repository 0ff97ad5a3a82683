package tracer_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// unixServerEnv makes this test binary a unix-socket echo server (see
// TestMain): the other end of the unix tests is a process of its own, with
// a name of its own.
const unixServerEnv = "DEPTRACE_TEST_UNIX_SERVER"

func TestMain(m *testing.M) {
	if path := os.Getenv(unixServerEnv); path != "" {
		os.Exit(serveUnix(path))
	}
	if os.Getenv(tcpServerEnv) == "1" {
		os.Exit(serveTCP())
	}
	os.Exit(runShared(m))
}

// serveUnix echoes every connection on a unix stream socket until stdin
// closes.
func serveUnix(path string) int {
	ln, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					_, _ = c.Write(buf[:n])
				}
			}()
		}
	}()
	_, _ = io.Copy(io.Discard, os.Stdin)
	ln.Close()
	return 0
}

// startUnixServer runs the echo server as a separate process named name.
func startUnixServer(t *testing.T, name, path string) {
	t.Helper()
	startUnixServerIn(t, nil, name, path)
}

// startUnixServerIn runs the echo server in host's network namespace (nil:
// this process's).
func startUnixServerIn(t *testing.T, host *testnet.Host, name, path string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), name)
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	if host != nil {
		cmd = host.Command(context.Background(), bin)
	}
	cmd.Env = append(os.Environ(), unixServerEnv+"="+path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	ready := make([]byte, 6)
	if _, err := io.ReadFull(stdout, ready); err != nil {
		t.Fatalf("unix server did not start: %v", err)
	}
}

// unixFlows returns the ledger's flows on one socket path.
func unixFlows(l *tracertest.Ledger, path string) (out, in tracer.Flow) {
	for _, f := range l.Flows {
		if f.Proto != tracer.ProtoUnix {
			continue
		}
		if f.Direction == tracer.Outbound && f.RemoteAddr == path {
			out = *f
		}
		if f.Direction == tracer.Inbound && f.LocalAddr == path {
			in = *f
		}
	}
	return out, in
}

// Both ends of a unix stream dependency, each process named, and each
// naming the process at the other end.
func TestUnixStreamBothEndsNamed(t *testing.T) {
	tr := startSharedTracer(t)
	for _, c := range []struct{ name, path string }{
		{"path", filepath.Join(t.TempDir(), "app.sock")},
		{"abstract", fmt.Sprintf("@deptrace-test-%d", os.Getpid())},
		// Five characters, as the kernel's autobind names (a NUL and five
		// hex digits), but not hex: a service like @redis.
		{"abstract-five", fmt.Sprintf("@r%04x", os.Getpid()&0xffff)},
	} {
		path := c.path
		t.Run(c.name, func(t *testing.T) {
			startUnixServer(t, "uxserver", path)
			const n, size = 5, 10
			for i := 0; i < n; i++ {
				c, err := net.Dial("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				if err := roundTrip(c, size, size); err != nil {
					t.Fatal(err)
				}
				c.Close()
			}
			l := tracertest.NewLedger()
			tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
				o, i := unixFlows(l, path)
				return o.BytesReceived >= n*size && i.BytesSent >= n*size && o.PeerComm != "" && i.PeerComm != ""
			})
			o, i := unixFlows(l, path)
			if !l.Counted(o.Connections, n) || !l.CountedBytes(o.BytesSent, n*size, size) || !l.CountedBytes(o.BytesReceived, n*size, size) || o.Port != 0 {
				t.Errorf("client side: %+v", o.Counters)
			}
			if o.Comm != testComm() || o.PeerComm != "uxserver" || o.PeerPID == 0 {
				t.Errorf("client side names %q with peer %d/%q; want %q with peer uxserver", o.Comm, o.PeerPID, o.PeerComm, testComm())
			}
			if !l.Counted(i.Connections, n) || !l.CountedBytes(i.BytesSent, n*size, size) || !l.CountedBytes(i.BytesReceived, n*size, size) {
				t.Errorf("server side: %+v", i.Counters)
			}
			if i.Comm != "uxserver" || i.PeerComm != testComm() || i.PID != o.PeerPID {
				t.Errorf("server side names %d/%q with peer %q; want uxserver/%d with peer %q", i.PID, i.Comm, i.PeerComm, o.PeerPID, testComm())
			}
		})
	}
}

// A unix server's end is in its own network namespace, as a volume-shared
// socket between containers has it: the kernel creates the socket a
// stream server accepts in the client's namespace, and deptrace moves the
// server's flow to the namespace of its process. Clients in two namespaces
// make one server flow; each client's flow stays in its own namespace.
func TestUnixServerEndIsInTheServersNamespace(t *testing.T) {
	tr := startSharedTracer(t)
	nw := testnet.New(t, 3)
	server, clients := nw.Hosts[0], nw.Hosts[1:]
	path := filepath.Join(t.TempDir(), "shared.sock")
	startUnixServerIn(t, server, "uxserver", path)
	const n, size = 3, 10
	for _, h := range clients {
		for i := 0; i < n; i++ {
			c, err := h.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			if err := roundTrip(c, size, size); err != nil {
				t.Fatal(err)
			}
			c.Close()
		}
	}
	l := tracertest.NewLedger()
	ends := func(l *tracertest.Ledger) (out map[uint32]tracer.Flow, in []tracer.Flow) {
		out = map[uint32]tracer.Flow{}
		for _, f := range l.Flows {
			switch {
			case f.Proto != tracer.ProtoUnix:
			case f.Direction == tracer.Outbound && f.RemoteAddr == path:
				out[f.NetNS] = *f
			case f.Direction == tracer.Inbound && f.LocalAddr == path:
				in = append(in, *f)
			}
		}
		return out, in
	}
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		out, in := ends(l)
		var served uint64
		for _, f := range in {
			served += f.BytesSent
		}
		return len(out) == 2 && served >= 2*n*size
	})
	out, in := ends(l)
	for _, h := range clients {
		if o := out[h.Inode]; !l.Counted(o.Connections, n) || o.PeerComm != "uxserver" {
			t.Errorf("client in %s: %+v; want %d connections to uxserver in its own namespace", h.Name, o, n)
		}
	}
	if len(in) != 1 || in[0].NetNS != server.Inode || in[0].Comm != "uxserver" || !l.Counted(in[0].Connections, 2*n) {
		for _, f := range in {
			t.Logf("server flow: netns %d, %s/%d, %+v", f.NetNS, f.Comm, f.PID, f.Counters)
		}
		t.Errorf("%d server flows; want one, in the server's namespace %s (%d), of uxserver, with %d connections (clients in %d and %d)",
			len(in), server.Name, server.Inode, 2*n, clients[0].Inode, clients[1].Inode)
	}
}

// Datagrams to a named socket (as syslog() sends to /dev/log) are unix
// flows too, counted in datagrams.
func TestUnixDatagramsToANamedSocket(t *testing.T) {
	tr := startSharedTracer(t)
	for _, c := range []struct{ name, path string }{
		{"path", filepath.Join(t.TempDir(), "log")},
		{"abstract-five", fmt.Sprintf("@q%04x", os.Getpid()&0xffff)}, // not an autobind name: q is no hex digit
	} {
		path := c.path
		t.Run(c.name, func(t *testing.T) {
			srv, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			c, err := net.Dial("unixgram", path)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const n = 3
			for i := 0; i < n; i++ {
				if _, err := c.Write([]byte("<13>hello")); err != nil {
					t.Fatal(err)
				}
				_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := srv.Read(make([]byte, 64)); err != nil {
					t.Fatal(err)
				}
			}
			l := tracertest.NewLedger()
			tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
				o, i := unixFlows(l, path)
				return o.DatagramsSent >= n && i.DatagramsReceived >= n
			})
			o, i := unixFlows(l, path)
			if !l.Counted(o.DatagramsSent, n) || !l.CountedBytes(o.BytesSent, n*9, 9) || o.Connections != 0 {
				t.Errorf("sender: %+v", o.Counters)
			}
			if !l.Counted(i.DatagramsReceived, n) || !l.CountedBytes(i.BytesReceived, n*9, 9) {
				t.Errorf("receiver: %+v", i.Counters)
			}
		})
	}
}

// Datagrams sent with sendto() to a path from an unconnected socket (as
// journald clients send), bound to a name of its own or not, are flows to
// that path, counted on the sender as on the receiver.
func TestUnixDatagramsSentToAPath(t *testing.T) {
	tr := startSharedTracer(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "journal")
	srv, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	unbound := unixSocket(t, syscall.SOCK_DGRAM)
	bound := unixSocket(t, syscall.SOCK_DGRAM)
	if err := syscall.Bind(bound, &syscall.SockaddrUnix{Name: filepath.Join(dir, "client")}); err != nil {
		t.Fatal(err)
	}
	const n, size = 4, 12
	msg := []byte("MESSAGE=hi\n\n")
	for _, fd := range []int{unbound, bound} {
		for i := 0; i < n; i++ {
			if err := syscall.Sendto(fd, msg, 0, &syscall.SockaddrUnix{Name: path}); err != nil {
				t.Fatal(err)
			}
			_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := srv.Read(make([]byte, 64)); err != nil {
				t.Fatal(err)
			}
		}
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		o, i := unixFlows(l, path)
		return o.DatagramsSent >= 2*n && i.DatagramsReceived >= 2*n
	})
	o, i := unixFlows(l, path)
	if !l.Counted(o.DatagramsSent, 2*n) || !l.CountedBytes(o.BytesSent, 2*n*size, size) || o.Connections != 0 || o.Comm != testComm() {
		t.Errorf("senders: %+v named %q; want %d datagrams (%d bytes) from %q", o.Counters, o.Comm, 2*n, 2*n*size, testComm())
	}
	if !l.Counted(i.DatagramsReceived, 2*n) || !l.CountedBytes(i.BytesReceived, 2*n*size, size) {
		t.Errorf("receiver: %+v", i.Counters)
	}
	for _, f := range l.Flows {
		if f.Proto == tracer.ProtoUnix && f.LocalAddr == filepath.Join(dir, "client") {
			t.Errorf("the bound sender's own name taken for a service: %+v", *f)
		}
	}
}
