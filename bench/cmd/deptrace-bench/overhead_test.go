package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/testnet"
)

// The whole-machine pairs with the DNS watcher beside the tracer, stopped
// by Ctrl-C during the second load's traced run: the watcher's programs
// are loaded then, the first load's table is printed all the same, and the
// run ends with one line saying why.
func TestOverheadPairsWithDNSKeepFinishedLoads(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "overhead", "--workloads", "", "--pairs", "1", "--pair-phase", "1s",
		"--pair-loads", "tcp-short,tcp-persistent", "--dns", "--min-reached", "0")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stderr []string
	interrupted := false
	sc := bufio.NewScanner(errPipe)
	for sc.Scan() {
		stderr = append(stderr, sc.Text())
		if !interrupted && strings.Contains(sc.Text(), "paired persistent TCP, pair 1: traced run") {
			if !loadedProgram(t, "dns_egress") || !loadedProgram(t, "dns_ingress") {
				t.Errorf("--dns: the DNS watcher's programs are not loaded during the traced run")
			}
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			interrupted = true
		}
	}
	err = cmd.Wait()
	all := strings.Join(stderr, "\n")
	if !interrupted {
		t.Fatalf("the second load never started (exit %v):\n%s", err, all)
	}
	if err == nil {
		t.Fatalf("an interrupted run exited 0:\n%s\n%s", all, stdout.String())
	}
	if last := stderr[len(stderr)-1]; !strings.HasPrefix(last, "deptrace-bench: ") {
		t.Errorf("last line of stderr %q, want the error", last)
	}
	out := stdout.String()
	for _, want := range []string{"the DNS watcher on, as trace and the agent run by default", "| short-lived TCP | 5000 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, out, all)
		}
	}
	if strings.Contains(out, "| persistent TCP |") {
		t.Errorf("the interrupted load has a row:\n%s", out)
	}
}

// loadedProgram reports whether a BPF program of that name is loaded.
func loadedProgram(t *testing.T, name string) bool {
	t.Helper()
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		_ = p.Close() // a read-only handle
		if err == nil && info.Name == name {
			return true
		}
	}
}
