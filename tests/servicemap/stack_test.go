package servicemap_test

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/pgtest"
	"github.com/deptrace/deptrace/internal/realtest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
)

// appPy is the WSGI app gunicorn serves. GET / talks to each backend with
// the standard library's sockets, reading each answer whole before
// closing (an unread answer would make the kernel send a reset): RESP
// PING to redis-server, "version" to memcached, a PostgreSQL startup
// message answered up to ReadyForQuery then Terminate, one UDP datagram
// to the collector. GET /down tries a port nothing listens on (refused)
// and one whose SYNs an nftables rule drops (a 0.5 s connect timeout).
const appPy = `import socket, struct

REDIS = ("{redis}", 6379)
MEMCACHED = ("{memcached}", 11211)
POSTGRES = ("{postgres}", 5432)
COLLECTOR = ("{collector}", 8125)
REFUSED = ("{down}", 7001)
DROPPED = ("{down}", 7002)


def exchange(addr, request, complete):
    s = socket.create_connection(addr, timeout=5)
    try:
        s.sendall(request)
        got = b""
        while not complete(got):
            b = s.recv(4096)
            if not b:
                raise ConnectionError("%s:%d closed after %r" % (addr + (got,)))
            got += b
        return got
    finally:
        s.close()


def pg_ready(got):
    # Messages: a type byte and a length (itself included); 'Z' is
    # ReadyForQuery, 'E' an error.
    i = 0
    while i + 5 <= len(got):
        kind, n = got[i:i + 1], struct.unpack("!i", got[i + 1:i + 5])[0]
        if i + 1 + n > len(got):
            return False
        if kind in (b"Z", b"E"):
            return True
        i += 1 + n
    return False


def postgres():
    params = b"user\0postgres\0database\0postgres\0\0"
    s = socket.create_connection(POSTGRES, timeout=5)
    try:
        s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
        got = b""
        while not pg_ready(got):
            b = s.recv(4096)
            if not b:
                raise ConnectionError("postgres closed after %r" % got)
            got += b
        if b"E" in got[:1]:
            raise ConnectionError("postgres: %r" % got)
        s.sendall(b"X\0\0\0\4")  # Terminate: the server closes, then we do
        while s.recv(4096):
            pass
        return "ready"
    finally:
        s.close()


def app(environ, start_response):
    out = []
    if environ["PATH_INFO"] == "/down":
        for name, addr in (("refused", REFUSED), ("dropped", DROPPED)):
            s = socket.socket()
            s.settimeout(0.5)
            try:
                s.connect(addr)
                out.append(name + ":connected")
            except OSError as e:
                out.append(name + ":" + type(e).__name__)
            finally:
                s.close()
    else:
        out.append("redis:" + exchange(REDIS, b"PING\r\n", lambda b: b.endswith(b"\r\n")).decode().strip())
        out.append("memcached:" + exchange(MEMCACHED, b"version\r\n", lambda b: b.endswith(b"\r\n")).decode().split()[0])
        out.append("postgres:" + postgres())
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.sendto(b"requests:1|c", COLLECTOR)
        u.close()
        out.append("collector:sent")
    body = (" ".join(out) + "\n").encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
`

// collectorPy counts datagrams: one line per datagram on its output.
const collectorPy = `import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 8125))
while True:
    data, peer = s.recvfrom(2048)
    print(data.decode(errors="replace"), flush=True)
`

// stack is the running service stack: a host per program.
type stack struct {
	client, nginx, app, redis, memcached, postgres, collector, down *testnet.Host
	collectorD                                                      *realtest.Daemon
}

// startStack starts the servers, each in its host, and returns once each
// listens (checked with ss: no probe traffic). The caller starts the
// agent first so that every listen() is seen.
func startStack(t *testing.T, nw *testnet.Network) *stack {
	t.Helper()
	h := nw.Hosts
	s := &stack{client: h[0], nginx: h[1], app: h[2], redis: h[3], memcached: h[4], postgres: h[5], collector: h[6], down: h[7]}

	dir := t.TempDir()
	r := realtest.StartDaemon(t, s.redis, dir, "redis", syscall.SIGTERM, "redis-server", "--bind", s.redis.IPv4.String(), "--port", "6379",
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no", "--dir", dir)
	m := realtest.StartDaemon(t, s.memcached, dir, "memcached", syscall.SIGTERM, "memcached", "-u", "root", "-l", s.memcached.IPv4.String(), "-p", "11211", "-U", "0")
	pg := startPostgres(t, s.postgres)
	if err := os.WriteFile(filepath.Join(dir, "collector.py"), []byte(collectorPy), 0o644); err != nil {
		t.Fatal(err)
	}
	s.collectorD = realtest.StartDaemon(t, s.collector, dir, "collector", syscall.SIGTERM, "/usr/bin/python3", "-u", filepath.Join(dir, "collector.py"), s.collector.IPv4.String())

	app := appPy
	for k, v := range map[string]*testnet.Host{"{redis}": s.redis, "{memcached}": s.memcached, "{postgres}": s.postgres, "{collector}": s.collector, "{down}": s.down} {
		app = strings.ReplaceAll(app, k, v.IPv4.String())
	}
	if err := os.WriteFile(filepath.Join(dir, "app.py"), []byte(app), 0o644); err != nil {
		t.Fatal(err)
	}
	g := realtest.StartDaemon(t, s.app, dir, "gunicorn", syscall.SIGTERM, "/usr/bin/gunicorn", "--chdir", dir, "--bind", s.app.IPv4.String()+":8000",
		"--workers", "2", "--worker-class", "sync", "--access-logfile", filepath.Join(dir, "access.log"), "app:app")

	n, _ := realtest.StartNginx(t, s.nginx, fmt.Sprintf("\tserver { listen %s:80; location / { proxy_pass http://%s:8000; } }", s.nginx.IPv4, s.app.IPv4))

	realtest.WaitListening(t, s.redis, r, "tcp", s.redis.IPv4.String()+":6379")
	realtest.WaitListening(t, s.memcached, m, "tcp", s.memcached.IPv4.String()+":11211")
	realtest.WaitListening(t, s.collector, s.collectorD, "udp", s.collector.IPv4.String()+":8125")
	realtest.WaitListening(t, s.app, g, "tcp", s.app.IPv4.String()+":8000")
	realtest.WaitListening(t, s.nginx, n, "tcp", s.nginx.IPv4.String()+":80")
	pg.ready(t)
	return s
}

// postgresD is a throwaway PostgreSQL listening on its host's address.
type postgresD struct {
	d    *realtest.Daemon
	data string
	h    *testnet.Host
}

// startPostgres makes a cluster with initdb in a temporary directory and
// runs the server (as the postgres user: PostgreSQL refuses root) in host
// h on its address, trusting the test network.
func startPostgres(t *testing.T, h *testnet.Host) *postgresD {
	t.Helper()
	bin, err := pgtest.BinDir()
	if err != nil {
		t.Fatal(err) // realtest.NeedPrograms() checked initdb already: a broken install
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running PostgreSQL as root needs a postgres user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	// Not t.TempDir: its parents are private to root, and the server runs
	// as postgres.
	dir, err := os.MkdirTemp("", "deptrace-servicemap-pg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) }) // best effort: a temporary directory
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	code, out, errOut := realtest.Run(t, nil, 60*time.Second, "setpriv", "--reuid", u.Uid, "--regid", u.Gid, "--clear-groups",
		filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
	if code != 0 {
		t.Fatalf("initdb: exit %d: %s%s", code, out, errOut)
	}
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(hba, "host all all %s/24 trust\n", h.IPv4.Mask(h.IPv4.DefaultMask()))
	if cerr := hba.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	d := realtest.StartDaemon(t, h, dir, "postgres", syscall.SIGINT, "setpriv", "--reuid", u.Uid, "--regid", u.Gid, "--clear-groups",
		filepath.Join(bin, "postgres"), "-D", data, "-c", "listen_addresses="+h.IPv4.String(), "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "max_connections=50")
	return &postgresD{d: d, data: data, h: h}
}

// ready waits until the server says it accepts connections (the status
// line of postmaster.pid), without connecting to it.
func (p *postgresD) ready(t *testing.T) {
	t.Helper()
	tracertest.Eventually(t, 30*time.Second, "postgres ready", func() error {
		p.d.MustRun(t)
		b, err := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
		if err != nil {
			return err
		}
		if lines := strings.Split(string(b), "\n"); len(lines) < 8 || strings.TrimSpace(lines[7]) != "ready" {
			return fmt.Errorf("postmaster.pid: %q", b)
		}
		return nil
	})
}
