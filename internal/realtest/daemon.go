package realtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
)

// Daemon is a long-running program a test started with StartDaemon.
type Daemon struct {
	Label string // names its output file and it in failures
	PID   int    // the program's own pid (ip netns exec execs it in place)
	out   string
	done  chan struct{}
}

// StartDaemon runs a program, inside host h when h is not nil (through ip
// netns exec, which execs it in place: PID is the program's), with dir as
// working directory, LC_ALL=C, and stdout and stderr in dir/LABEL.out. It
// is stopped with Stop(stopSig) when the test ends.
func StartDaemon(t testing.TB, h *testnet.Host, dir, label string, stopSig syscall.Signal, name string, args ...string) *Daemon {
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
	d := &Daemon{Label: label, PID: cmd.Process.Pid, out: outPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = out.Close(); close(d.done) }() // its end is read from done and its output
	t.Cleanup(func() { d.Stop(t, stopSig) })
	return d
}

// Stop ends the daemon, once (later calls do nothing): SIGCONT to it and
// its descendants (a stopped process would never act on sig), sig, then
// SIGKILL after 10 s (an error of the test), then SIGKILL to whatever
// descendants it left.
func (d *Daemon) Stop(t testing.TB, sig syscall.Signal) {
	if d.Exited() {
		return
	}
	kids := Descendants(d.PID)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGCONT) // gone already, some of them
	}
	_ = syscall.Kill(d.PID, syscall.SIGCONT) // it may have exited meanwhile: done says so
	_ = syscall.Kill(d.PID, sig)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s (pid %d) ignored %s for 10 s; killing it", d.Label, d.PID, sig)
		_ = syscall.Kill(d.PID, syscall.SIGKILL)
		<-d.done
	}
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL) // gone already, most of them
	}
}

// Exited reports whether the daemon is gone.
func (d *Daemon) Exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// Output is what the daemon printed so far.
func (d *Daemon) Output() string {
	b, _ := os.ReadFile(d.out)
	return string(b)
}

// MustRun fails the test, with the daemon's output, when it is gone.
func (d *Daemon) MustRun(t testing.TB) {
	t.Helper()
	if d.Exited() {
		t.Fatalf("%s exited:\n%s", d.Label, d.Output())
	}
}

// WaitListening waits up to 20 s until a socket listens on addr
// ("ADDRESS:PORT") in host h, proto "tcp" or "udp", failing at once when
// d, the daemon that should open it, is gone. It reads the socket tables
// with ss (over netlink), so it adds no traffic that a probe would.
func WaitListening(t testing.TB, h *testnet.Host, d *Daemon, proto, addr string) {
	t.Helper()
	flag := "-Hltn"
	if proto == "udp" {
		flag = "-Hlun"
	}
	tracertest.Eventually(t, 20*time.Second, d.Label+" listens on "+proto+" "+addr, func() error {
		d.MustRun(t)
		code, out, errOut := Run(t, h, 10*time.Second, "ss", flag, "src", addr)
		if code != 0 {
			return fmt.Errorf("ss: exit %d: %s", code, errOut)
		}
		if strings.TrimSpace(out) == "" {
			return errors.New("nothing listens yet")
		}
		return nil
	})
}
