package servicemap_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// daemon is a long-running program this test started.
type daemon struct {
	name string
	pid  int
	out  string
	done chan struct{}
}

// startDaemon runs a program (inside host h when h is not nil, through ip
// netns exec, which execs it in place: the pid is the program's) in dir,
// output in dir/LABEL.out. It is stopped by pid when the test ends:
// stopSig, then SIGKILL after 10 s, then SIGKILL to whatever children it
// left.
func startDaemon(t *testing.T, h *testnet.Host, dir, label string, stopSig syscall.Signal, name string, args ...string) *daemon {
	t.Helper()
	var cmd *exec.Cmd
	if h != nil {
		cmd = exec.Command("ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	outPath := filepath.Join(dir, label+".out")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close() // the start error is the one to report
		t.Fatalf("start %s: %v", name, err)
	}
	d := &daemon{name: label, pid: cmd.Process.Pid, out: outPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = out.Close(); close(d.done) }() // its end is read from done and its output
	t.Cleanup(func() { d.stop(t, stopSig) })
	return d
}

// stop ends the daemon (idempotent): sig, SIGKILL after 10 s, then its
// leftover children.
func (d *daemon) stop(t *testing.T, sig syscall.Signal) {
	select {
	case <-d.done:
		return
	default:
	}
	kids := descendants(d.pid)
	_ = syscall.Kill(d.pid, sig) // it may have exited meanwhile: done says so
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s (pid %d) ignored %s for 10 s; killing it", d.name, d.pid, sig)
		_ = syscall.Kill(d.pid, syscall.SIGKILL)
		<-d.done
	}
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL) // gone already, most of them
	}
}

// output is what the daemon printed so far.
func (d *daemon) output() string {
	b, _ := os.ReadFile(d.out)
	return string(b)
}

// mustRun fails the test, with the daemon's output, when it is gone.
func (d *daemon) mustRun(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		t.Fatalf("%s exited:\n%s", d.name, d.output())
	default:
	}
}

func procPPID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:])
	if i < 0 || len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, s)
	}
	return strconv.Atoi(f[1])
}

func descendants(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := procPPID(p); err == nil && pp == pid {
			out = append(out, p)
			out = append(out, descendants(p)...)
		}
	}
	return out
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

// waitFor polls cond every 50 ms for at most limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	tracertest.Eventually(t, limit, what, cond)
}

// listening waits until a socket listens on addr:port in host h (ss reads
// the socket tables over netlink: no traffic a probe would add to the
// map), failing at once when the daemon that should open it is gone.
func listening(t *testing.T, h *testnet.Host, d *daemon, proto, addr string) {
	t.Helper()
	flag := "-Hltn"
	if proto == "udp" {
		flag = "-Hlun"
	}
	waitFor(t, 20*time.Second, d.name+" listens on "+proto+" "+addr, func() error {
		d.mustRun(t)
		code, out, errOut := run(t, h, 10*time.Second, "ss", flag, "src", addr)
		if code != 0 {
			return fmt.Errorf("ss: exit %d: %s", code, errOut)
		}
		if strings.TrimSpace(out) == "" {
			return errors.New("nothing listens yet")
		}
		return nil
	})
}

// nft loads an nftables ruleset into host h's namespace (removed with the
// namespace when the test ends).
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
