package container_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dockertest"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/tracer"
)

// buildBinary builds the static deptrace binary as `make build` does.
func buildBinary(t *testing.T) string {
	t.Helper()
	goBin := dockertest.Need(t, "go", "golang-go")
	bin := filepath.Join(t.TempDir(), "deptrace")
	build := exec.Command(goBin, "build", "-trimpath", "-ldflags", "-s -w -X main.version="+imageVersion, "-o", bin, "./cmd/deptrace")
	build.Dir = repoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	return bin
}

// hostRun is deptrace running on the host (not in a container).
type hostRun struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr *lineWatch
	exited chan error
}

// startHost runs deptrace with args and returns once it logs ready.
func startHost(t *testing.T, bin, ready string, args ...string) *hostRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	h := &hostRun{cmd: exec.CommandContext(ctx, bin, args...), exited: make(chan error, 1)}
	h.cmd.Stdout = &h.stdout
	errPipe, err := h.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.stderr = watchLines(errPipe, ready)
	go func() {
		<-h.stderr.done
		h.exited <- h.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = h.cmd.Process.Kill() // already gone when the test stopped it
		cancel()
	})
	select {
	case <-h.stderr.seen:
	case err := <-h.exited:
		t.Fatalf("deptrace %s exited (%v) before it was ready:\n%s", args[0], err, h.stderr.bytes())
	case <-time.After(60 * time.Second):
		t.Fatalf("deptrace %s not ready after 60 s:\n%s", args[0], h.stderr.bytes())
	}
	return h
}

// stop sends SIGTERM (deptrace drains a last time) and waits for the exit.
func (h *hostRun) stop(t *testing.T) []byte {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-h.exited:
		if err != nil {
			t.Fatalf("deptrace %s: %v:\n%s", h.cmd.Args[1], err, h.stderr.bytes())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("deptrace %s did not stop after SIGTERM:\n%s", h.cmd.Args[1], h.stderr.bytes())
	}
	if bytes.Contains(h.stderr.bytes(), []byte("level=ERROR")) {
		t.Errorf("deptrace %s logged an error:\n%s", h.cmd.Args[1], h.stderr.bytes())
	}
	return h.stdout.Bytes()
}

// jsonlFlows reads the flow records of `deptrace trace --output jsonl`.
func jsonlFlows(t *testing.T, out []byte) []tracer.Flow {
	t.Helper()
	var flows []tracer.Flow
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		var kind struct{ Kind string }
		if err := json.Unmarshal(s.Bytes(), &kind); err != nil {
			t.Fatalf("jsonl line %q: %v", s.Text(), err)
		}
		if kind.Kind != "flow" {
			continue
		}
		var f tracer.Flow
		if err := json.Unmarshal(s.Bytes(), &f); err != nil {
			t.Fatalf("jsonl line %q: %v", s.Text(), err)
		}
		flows = append(flows, f)
	}
	return flows
}

// testPinPath is where a test's agent pins its kernel side: under the
// prefix internal/testnet clears if this process dies.
func testPinPath(t *testing.T, name string) string {
	p := filepath.Join(filepath.Dir(tracer.DefaultPinPath), fmt.Sprintf("deptrace-test-%d-%s", os.Getpid(), name))
	t.Cleanup(func() { _, _ = tracer.Cleanup(p) }) // nothing left after a clean stop
	return p
}

// netnsOf is a running container's network namespace inode.
func netnsOf(t *testing.T, d *dockertest.Daemon, name string) uint32 {
	t.Helper()
	pid := d.Must(t, "inspect", "--format", "{{.State.Pid}}", name)
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+pid+"/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return uint32(st.Ino)
}

// readGraph runs `deptrace graph` on a store and decodes its JSON.
func readGraph(t *testing.T, bin, store string, args ...string) graph.Graph {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"graph", "--store", store, "--since", "1h"}, args...)...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("deptrace graph %v: %v: %s", args, err, stderr)
	}
	var g graph.Graph
	if err := json.Unmarshal(out, &g); err != nil {
		t.Fatalf("graph JSON: %v: %s", err, out)
	}
	return g
}
