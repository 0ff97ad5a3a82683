// Package realtest is for privileged tests that drive real programs
// (nginx, gunicorn, redis-server, curl, nft, ...) in internal/testnet
// namespaces: check that the programs are installed, run one to
// completion with a time limit, start a daemon and stop it when the test
// ends, read /proc about its processes, wait for it to listen, load an
// nftables ruleset and read its counters, and write an nginx
// configuration. tests/realsoftware and tests/servicemap use it.
package realtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
)

// NeedPrograms fails the test under CI (testnet.UnderCI: CI must never
// pass by skipping) when one of progs is not on PATH, and skips it
// elsewhere.
func NeedPrograms(t testing.TB, progs ...string) {
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

// Run runs a program to completion, inside host h when h is not nil, with
// LC_ALL=C, and returns its exit code, stdout and stderr. It fails the
// test when the program cannot start or still runs after limit.
func Run(t testing.TB, h *testnet.Host, limit time.Duration, name string, args ...string) (code int, stdout, stderr string) {
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

// HTTPGet sends one HTTP/1.0 GET / over c, closes c, and returns the
// whole response, or an error when it does not start like one.
func HTTPGet(c net.Conn) (string, error) {
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
