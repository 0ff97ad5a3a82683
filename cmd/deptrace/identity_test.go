package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

func TestTraceIdentityBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"trace", "--identity-retain", "0s"}, nil, "invalid --identity-retain 0s: allowed 1s to 24h"},
		{[]string{"trace"}, []string{"DEPTRACE_IDENTITY_RETAIN=48h"}, "invalid --identity-retain 48h: allowed 1s to 24h"},
	} {
		stdout, stderr, code := run(t, c.env, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], c.want) || stdout != "" {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 1 and one line containing %q", c.env, c.args, code, stderr, c.want)
		}
	}
}

// trace names a client in a systemd service's cgroup by its unit in
// jsonl, and --no-identity leaves the field out.
func TestTraceNamesUnit(t *testing.T) {
	testnet.RequireRoot(t)
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	slice := filepath.Join(root, "system.slice")
	if err := os.Mkdir(slice, 0o755); err == nil {
		t.Cleanup(func() { os.Remove(slice) })
	} else if !os.IsExist(err) {
		t.Fatal(err)
	}
	unit := fmt.Sprintf("deptrace-cli-%d.service", os.Getpid())
	dir := filepath.Join(slice, unit)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		extra    []string
		wantUnit string
	}{{nil, unit}, {[]string{"--no-identity"}, ""}} {
		p := start(t, append([]string{"trace", "--output", "jsonl", "--duration", "3s", "--proto", "tcp", "--port", port}, tc.extra...)...)
		cg, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		client := exec.Command("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+port)
		client.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		out, err := client.CombinedOutput()
		cg.Close()
		if err != nil {
			t.Fatalf("client: %v: %s", err, out)
		}
		p.wait(t)
		found := false
		for _, line := range strings.Split(strings.TrimSpace(p.stdout.String()), "\n") {
			var f tracer.Flow
			if err := json.Unmarshal([]byte(line), &f); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			if f.Kind != tracer.KindFlow || f.Direction != tracer.Outbound || f.PID != uint32(client.Process.Pid) {
				continue
			}
			found = true
			if f.Unit != tc.wantUnit || strings.Contains(line, `"unit"`) != (tc.wantUnit != "") {
				t.Errorf("trace %v: client flow %s; want unit %q", tc.extra, line, tc.wantUnit)
			}
		}
		if !found {
			t.Errorf("trace %v: no flow of the client (pid %d):\n%s", tc.extra, client.Process.Pid, p.stdout.String())
		}
	}
}

// deptrace does not connect to a runtime socket that is not there: a
// refused connect of its own would show in every trace as a failing
// dependency of deptrace. A socket file nobody listens on is connected to
// (the runtime may come back) and that failure is seen: the control that
// the trace would show the other one too.
func TestTraceSkipsAMissingRuntimeSocket(t *testing.T) {
	testnet.RequireRoot(t)
	dir := t.TempDir()
	dead := filepath.Join(dir, "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the file stays, nobody listens
	missing := filepath.Join(dir, "missing.sock")
	stdout, stderr, code := run(t, nil, "trace", "-o", "jsonl", "--duration", "4s", "--syscall-tracepoints", "--proto", "unix",
		"--docker-socket", dead, "--podman-socket", missing, "--containerd-socket", "", "--crio-socket", "")
	if code != 0 {
		t.Fatalf("trace exit %d: %s", code, stderr)
	}
	var toDead, toMissing uint64
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var f tracer.Flow
		if json.Unmarshal([]byte(line), &f) != nil || f.Kind != tracer.KindFlow {
			continue
		}
		switch f.RemoteAddr {
		case dead:
			toDead += f.FailedConnections
		case missing:
			toMissing += f.Connections + f.FailedConnections
		}
	}
	if toDead == 0 {
		t.Errorf("no failed connect to the dead socket %s seen (the control):\n%s", dead, stdout)
	}
	if toMissing != 0 {
		t.Errorf("deptrace connected %d times to the missing socket %s:\n%s", toMissing, missing, stdout)
	}
}
