package realsoftware_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// need fails the test under CI=true when a program is missing (CI must
// never pass by skipping) and skips it elsewhere.
func need(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			msg := fmt.Sprintf("%s not installed (scripts/deps.sh installs it): %v", p, err)
			if testnet.UnderCI() {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

func startTracer(t *testing.T) *tracer.Tracer {
	t.Helper()
	return tracertest.Start(t, nil)
}

// daemon is a long-running program this test started.
type daemon struct {
	name string
	pid  int
	dir  string
	done chan struct{}
}

// startDaemon runs a program (inside host h when h is not nil, through
// ip netns exec, which execs it in place: the pid is the program's) with
// its own temporary directory as working directory, output in
// dir/NAME.out. It is stopped by pid when the test ends: stopSig, then
// SIGKILL after 10 s, then SIGKILL to whatever children it left.
func startDaemon(t *testing.T, h *testnet.Host, dir string, stopSig syscall.Signal, name string, args ...string) *daemon {
	t.Helper()
	var cmd *exec.Cmd
	if h != nil {
		cmd = exec.Command("ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(dir, filepath.Base(name)+".out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	d := &daemon{name: name, pid: cmd.Process.Pid, dir: dir, done: make(chan struct{})}
	go func() { cmd.Wait(); out.Close(); close(d.done) }()
	t.Cleanup(func() {
		kids := descendants(d.pid)
		for _, k := range kids { // a stopped process would never act on stopSig
			syscall.Kill(k, syscall.SIGCONT)
		}
		syscall.Kill(d.pid, syscall.SIGCONT)
		syscall.Kill(d.pid, stopSig)
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) ignored %s for 10 s; killing it", name, d.pid, stopSig)
			syscall.Kill(d.pid, syscall.SIGKILL)
			<-d.done
		}
		for _, k := range kids {
			if alive(k) {
				syscall.Kill(k, syscall.SIGKILL)
			}
		}
	})
	return d
}

// exited reports whether the daemon is gone, with its output.
func (d *daemon) exited() (bool, string) {
	select {
	case <-d.done:
		b, _ := os.ReadFile(filepath.Join(d.dir, filepath.Base(d.name)+".out"))
		return true, string(b)
	default:
		return false, ""
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// procStat returns a process's state letter and parent pid.
func procStat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, s)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, s)
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, pp, err := procStat(p); err == nil && pp == pid {
			out = append(out, p)
		}
	}
	return out
}

func descendants(pid int) []int {
	var out []int
	for _, c := range children(pid) {
		out = append(out, c)
		out = append(out, descendants(c)...)
	}
	return out
}

// comm is a process's name as the kernel reports it in /proc/PID/comm.
func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// waitFor polls cond every 50 ms for at most limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	tracertest.Eventually(t, limit, what, cond)
}

// httpGet sends one HTTP/1.0 GET over c and returns the whole response.
func httpGet(c net.Conn) (string, error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\nHost: probe\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	if !bytes.HasPrefix(b, []byte("HTTP/1.")) {
		return "", fmt.Errorf("not an HTTP response: %q", b)
	}
	return string(b), nil
}

// run runs a program to completion (inside host h when not nil) within
// limit and returns its exit code, stdout and stderr.
func run(t *testing.T, h *testnet.Host, limit time.Duration, name string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var cmd *exec.Cmd
	if h != nil {
		cmd = h.Command(ctx, name, args...)
	} else {
		cmd = exec.CommandContext(ctx, name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v: still running after %s", name, args, limit)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), o.String(), e.String()
	}
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return 0, o.String(), e.String()
}

// nginxConf writes an nginx configuration into dir: one master, one
// worker, running as root (the worker must reach sockets in the test's
// private temporary directories), every path inside dir, and a readiness
// server on 127.0.0.1:8081 of its namespace. servers are the http-level
// server blocks and directives to add; "{dir}" in them stands for dir.
func nginxConf(t *testing.T, dir, servers string) string {
	t.Helper()
	conf := fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 256; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	server { listen 127.0.0.1:8081; location / { return 204; } }
%[2]s
}
`, dir, strings.ReplaceAll(servers, "{dir}", dir))
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startNginx runs nginx with servers inside host h and returns its master
// and its one worker once the readiness server answers.
func startNginx(t *testing.T, h *testnet.Host, servers string) (master, worker int, dir string) {
	t.Helper()
	dir = t.TempDir()
	conf := nginxConf(t, dir, servers)
	d := startDaemon(t, h, dir, syscall.SIGTERM, "nginx", "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", conf)
	waitFor(t, 15*time.Second, "nginx answers on 127.0.0.1:8081", func() error {
		if gone, out := d.exited(); gone {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %s\n%s", out, log)
		}
		c, err := h.Dial("tcp4", "127.0.0.1:8081")
		if err != nil {
			return err
		}
		_, err = httpGet(c)
		return err
	})
	var workers []int
	waitFor(t, 10*time.Second, "nginx worker", func() error {
		if workers = children(d.pid); len(workers) != 1 {
			return fmt.Errorf("nginx master %d has children %v; want one worker", d.pid, workers)
		}
		return nil
	})
	return d.pid, workers[0], dir
}

// nft loads an nftables ruleset into host h's namespace.
func nft(t *testing.T, h *testnet.Host, ruleset string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.nft")
	if err := os.WriteFile(path, []byte(ruleset), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run(t, h, 10*time.Second, "nft", "-f", path); code != 0 {
		t.Fatalf("nft -f: exit %d: %s%s", code, out, errOut)
	}
}

// nftCounter reads the packets counted by the rule of a chain whose text
// contains match.
func nftCounter(t *testing.T, h *testnet.Host, table, chain, match string) uint64 {
	t.Helper()
	code, out, errOut := run(t, h, 10*time.Second, "nft", "list", "chain", "ip", table, chain)
	if code != 0 {
		t.Fatalf("nft list chain: exit %d: %s", code, errOut)
	}
	for _, line := range strings.Split(out, "\n") {
		i := strings.Index(line, "counter packets ")
		if i < 0 || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line[i+len("counter packets "):])
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			t.Fatalf("counter in %q: %v", line, err)
		}
		return n
	}
	t.Fatalf("no counter on a rule with %q in chain %s: %s", match, chain, out)
	return 0
}
