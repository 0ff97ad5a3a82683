package realsoftware_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/realtest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

const wsgiApp = `def app(environ, start_response):
    body = b"hello from gunicorn\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
`

// curl -> nginx (tcp) -> gunicorn (unix socket), the classic Python web
// stack. Host b runs nginx and gunicorn, host a runs curl.
func TestNginxProxiesToGunicornOverUnixSocket(t *testing.T) {
	realtest.NeedPrograms(t, "nginx", "gunicorn", "curl", "ip")
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]

	// gunicorn first, probed over its socket with one full request before
	// deptrace starts, so the probe is no part of what is counted.
	gdir := t.TempDir()
	if err := os.WriteFile(filepath.Join(gdir, "app.py"), []byte(wsgiApp), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(gdir, "app.sock")
	g := realtest.StartDaemon(t, b, gdir, "gunicorn", syscall.SIGTERM, "gunicorn", "--chdir", gdir, "--bind", "unix:"+sock,
		"--workers", "2", "--worker-class", "sync", "--access-logfile", filepath.Join(gdir, "access.log"), "app:app")
	tracertest.Eventually(t, 20*time.Second, "gunicorn answers on "+sock, func() error {
		g.MustRun(t)
		c, err := net.DialTimeout("unix", sock, 2*time.Second)
		if err != nil {
			return err
		}
		_, err = realtest.HTTPGet(c)
		return err
	})
	var gworkers []int
	tracertest.Eventually(t, 10*time.Second, "two gunicorn workers", func() error {
		if gworkers = realtest.Children(g.PID); len(gworkers) != 2 {
			return fmt.Errorf("gunicorn arbiter %d has children %v", g.PID, gworkers)
		}
		return nil
	})
	probes, _ := os.ReadFile(filepath.Join(gdir, "access.log"))
	probeLines := strings.Count(string(probes), "\n")

	tr := startTracer(t)
	master, worker, ndir := startNginx(t, b, fmt.Sprintf(`
	log_format up '$upstream_bytes_sent $upstream_bytes_received $upstream_status';
	server {
		listen %s:8080;
		location / { proxy_pass http://unix:%s; access_log {dir}/upstream.log up; }
	}`, b.IPv4, sock))
	t.Logf("processes as /proc names them: nginx master %d %q, worker %d %q; gunicorn arbiter %d %q, workers %v %q",
		master, realtest.Comm(master), worker, realtest.Comm(worker), g.PID, realtest.Comm(g.PID), gworkers, realtest.Comm(gworkers[0]))
	if realtest.Comm(worker) != "nginx" || realtest.Comm(gworkers[0]) != "gunicorn" || realtest.Comm(gworkers[1]) != "gunicorn" {
		t.Fatalf("unexpected process names: nginx worker %q, gunicorn workers %q %q", realtest.Comm(worker), realtest.Comm(gworkers[0]), realtest.Comm(gworkers[1]))
	}

	// N requests, one curl process each: N connections curl -> nginx.
	const n = 20
	var curlSent, curlRecv uint64
	for i := 0; i < n; i++ {
		code, out, errOut := realtest.Run(t, a, 20*time.Second, "curl", "-sS", "--max-time", "10", "-o", "/dev/null",
			"-w", "%{http_code} %{size_request} %{size_header} %{size_download}", fmt.Sprintf("http://%s:8080/", b.IPv4))
		f := strings.Fields(out)
		if code != 0 || len(f) != 4 || f[0] != "200" {
			t.Fatalf("curl %d: exit %d, %q %s", i, code, out, errOut)
		}
		req, _ := strconv.ParseUint(f[1], 10, 64)
		hdr, _ := strconv.ParseUint(f[2], 10, 64)
		body, _ := strconv.ParseUint(f[3], 10, 64)
		curlSent += req
		curlRecv += hdr + body
	}

	// What really happened upstream: nginx's own byte counts per request,
	// and the requests gunicorn served (its sync workers close every
	// connection after one response, and nginx without an upstream
	// keepalive pool opens one connection per request).
	upLog, err := os.ReadFile(filepath.Join(ndir, "upstream.log"))
	if err != nil {
		t.Fatal(err)
	}
	var upSent, upRecv uint64
	upLines := strings.Split(strings.TrimSpace(string(upLog)), "\n")
	for _, line := range upLines {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "200" {
			t.Fatalf("upstream log line %q", line)
		}
		s, _ := strconv.ParseUint(f[0], 10, 64)
		r, _ := strconv.ParseUint(f[1], 10, 64)
		upSent += s
		upRecv += r
	}
	served, _ := os.ReadFile(filepath.Join(gdir, "access.log"))
	if got := strings.Count(string(served), "\n") - probeLines; len(upLines) != n || got != n {
		t.Fatalf("nginx logged %d upstream requests and gunicorn served %d; want %d each", len(upLines), got, n)
	}

	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		o, i := l.Unix(sock)
		return o.Connections >= n && i.Connections >= n && o.BytesReceived >= upRecv && i.BytesReceived >= upSent &&
			l.TCP(a.Inode, tracer.Outbound, 8080).BytesReceived >= curlRecv && l.TCP(b.Inode, tracer.Inbound, 8080).BytesReceived >= curlSent
	})
	t.Logf("ledger:%s", l.About([]uint32{a.Inode, b.Inode}))

	o, i := l.Unix(sock)
	if o.NetNS != b.Inode || o.Port != 0 || o.LocalAddr != "" {
		t.Errorf("nginx side: netns %d port %d local %q; want netns %d, port 0, local \"\"", o.NetNS, o.Port, o.LocalAddr, b.Inode)
	}
	if o.Connections != n || o.FailedConnections != 0 || o.BytesSent != upSent || o.BytesReceived != upRecv {
		t.Errorf("nginx -> gunicorn: %+v; want %d connections, %d bytes sent, %d received (nginx's $upstream_bytes_*)", o.Counters, n, upSent, upRecv)
	}
	if o.PID != uint32(worker) || o.Comm != "nginx" {
		t.Errorf("nginx side named %d/%q; want the nginx worker %d/\"nginx\"", o.PID, o.Comm, worker)
	}
	if !slices.Contains(gworkers, int(o.PeerPID)) || o.PeerComm != "gunicorn" {
		t.Errorf("nginx side's peer %d/%q; want a gunicorn worker %v (not the arbiter %d that listens)", o.PeerPID, o.PeerComm, gworkers, g.PID)
	}
	if i.NetNS != b.Inode || i.Port != 0 || i.RemoteAddr != "" {
		t.Errorf("gunicorn side: netns %d port %d remote %q; want netns %d, port 0, remote \"\"", i.NetNS, i.Port, i.RemoteAddr, b.Inode)
	}
	if i.Connections != n || i.BytesReceived != upSent || i.BytesSent != upRecv {
		t.Errorf("gunicorn <- nginx: %+v; want %d connections, %d bytes received, %d sent", i.Counters, n, upSent, upRecv)
	}
	if !slices.Contains(gworkers, int(i.PID)) || i.Comm != "gunicorn" || i.PeerPID != uint32(worker) || i.PeerComm != "nginx" {
		t.Errorf("gunicorn side named %d/%q with peer %d/%q; want a worker of %v \"gunicorn\" with peer %d \"nginx\"",
			i.PID, i.Comm, i.PeerPID, i.PeerComm, gworkers, worker)
	}

	out := l.TCP(a.Inode, tracer.Outbound, 8080)
	if out.LocalAddr != a.IPv4.String() || out.RemoteAddr != b.IPv4.String() || out.Comm != "curl" {
		t.Errorf("curl side: %s -> %s named %q; want %s -> %s, \"curl\"", out.LocalAddr, out.RemoteAddr, out.Comm, a.IPv4, b.IPv4)
	}
	if out.Connections != n || out.FailedConnections != 0 || out.BytesSent != curlSent || out.BytesReceived != curlRecv || out.ConnectLatencyCount != n {
		t.Errorf("curl -> nginx: %+v; want %d connections, %d bytes sent, %d received (curl's own counts)", out.Counters, n, curlSent, curlRecv)
	}
	in := l.TCP(b.Inode, tracer.Inbound, 8080)
	if in.LocalAddr != b.IPv4.String() || in.RemoteAddr != a.IPv4.String() || in.PID != uint32(master) || in.Comm != "nginx" {
		t.Errorf("nginx inbound: %s <- %s named %d/%q; want %s <- %s, the nginx master %d that listens", in.LocalAddr, in.RemoteAddr, in.PID, in.Comm, b.IPv4, a.IPv4, master)
	}
	if in.Connections != n || in.BytesReceived != curlSent || in.BytesSent != curlRecv {
		t.Errorf("nginx <- curl: %+v; want %d connections, %d received, %d sent", in.Counters, n, curlSent, curlRecv)
	}
	if l.StreamLosses() != 0 {
		t.Errorf("lost: %+v", l.Lost)
	}
}

// psql -> PostgreSQL listening only on its socket directory.
func TestPsqlToPostgresOverUnixSocket(t *testing.T) {
	realtest.NeedPrograms(t, "psql")
	testnet.RequireRoot(t)
	cl := pgtest.New(t) // listen_addresses='', unix_socket_directories=its temp dir
	host := ""
	for _, kv := range strings.Split(cl.DSN[strings.IndexByte(cl.DSN, '?')+1:], "&") {
		if v, ok := strings.CutPrefix(kv, "host="); ok {
			host = v
		}
	}
	if host == "" {
		t.Fatalf("no socket directory in %s", cl.DSN)
	}
	sock := filepath.Join(host, ".s.PGSQL.5432")
	lock, err := os.ReadFile(sock + ".lock") // first line: the postmaster's pid
	if err != nil {
		t.Fatal(err)
	}
	postmaster, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(lock), "\n", 2)[0]))
	if err != nil {
		t.Fatalf("socket lock file %s: %v", sock+".lock", err)
	}
	t.Logf("postmaster %d is %q in /proc", postmaster, realtest.Comm(postmaster))
	if realtest.Comm(postmaster) != "postgres" {
		t.Fatalf("postmaster %d is named %q", postmaster, realtest.Comm(postmaster))
	}

	tr := startTracer(t) // after initdb and createdb, so only psql's connections count
	const k = 7
	for i := 0; i < k; i++ {
		code, out, errOut := realtest.Run(t, nil, 20*time.Second, "psql", "-X", "-At", "-h", host, "-U", "postgres", "-d", "deptrace", "-c", "select 1")
		if code != 0 || strings.TrimSpace(out) != "1" {
			t.Fatalf("psql: exit %d: %q %s", code, out, errOut)
		}
	}
	l := tracertest.NewLedger()
	tracertest.Settle(t, tr, l, func(l *tracertest.Ledger) bool {
		o, i := l.Unix(sock)
		return o.Connections >= k && i.Connections >= k && o.BytesSent > 0 && i.BytesSent > 0
	})
	o, i := l.Unix(sock)
	t.Logf("psql side pid %d %q peer %d %q: %+v", o.PID, o.Comm, o.PeerPID, o.PeerComm, o.Counters)
	t.Logf("postgres side pid %d %q peer %d %q: %+v", i.PID, i.Comm, i.PeerPID, i.PeerComm, i.Counters)
	if o.Connections != k || o.Comm != "psql" || o.PeerComm != "postgres" || o.PeerPID == 0 || o.PeerPID == uint32(postmaster) {
		t.Errorf("psql side: %+v named %q, peer %d/%q; want %d connections, psql, peer a postgres backend (not the postmaster %d)",
			o.Counters, o.Comm, o.PeerPID, o.PeerComm, k, postmaster)
	}
	if i.Connections != k || i.Comm != "postgres" || i.PID == uint32(postmaster) || i.PeerComm != "psql" {
		t.Errorf("postgres side: %+v named %d/%q, peer %q; want %d connections, a postgres backend, peer psql", i.Counters, i.PID, i.Comm, i.PeerComm, k)
	}
	if o.BytesSent != i.BytesReceived || o.BytesReceived != i.BytesSent {
		t.Errorf("the two ends disagree: psql sent %d received %d, postgres received %d sent %d", o.BytesSent, o.BytesReceived, i.BytesReceived, i.BytesSent)
	}
	if l.StreamLosses() != 0 {
		t.Errorf("lost: %+v", l.Lost)
	}
}
