package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/kernel"
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
	interrupted := false
	stdout, stderr, err := runOverhead(t, ctx, func(cmd *exec.Cmd, line string) {
		if interrupted || !strings.Contains(line, "paired persistent TCP, pair 1: traced run") {
			return
		}
		names := programsOf(t, cmd.Process.Pid)
		// As trace loads them: from 6.3 the per-call pair, in the
		// tracer's calls; before, the per-packet pair.
		want := []string{"dns_send", "dns_recv"}
		if !kernel.Has("btf_trace_sock_send_length") {
			want = []string{"dns_egress", "dns_ingress"}
		}
		if !hasPrefix(names, want[0]) || !hasPrefix(names, want[1]) {
			t.Errorf("--dns: the DNS watcher's programs %v are not among the run's during its traced run: %v", want, names)
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		interrupted = true
	}, "--pair-loads", "tcp-short,tcp-persistent", "--dns")
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

// The whole-machine pairs with a bench compare method in place of
// deptrace: its programs, not deptrace's, run during the traced run, and
// the table says which method it measured.
func TestOverheadPairsWithAMethod(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	looked := false
	stdout, stderr, err := runOverhead(t, ctx, func(cmd *exec.Cmd, line string) {
		if looked || !strings.Contains(line, "pair 1: traced run") {
			return
		}
		// The streaming baseline's bind hook; deptrace's getsockopt
		// program, which the baseline lacks.
		names := programsOf(t, cmd.Process.Pid)
		if !slices.Contains(names, "udp_prebind4") || slices.Contains(names, "connect_error") {
			t.Errorf("--pair-method streaming: the traced run holds %v; want the streaming baseline's udp_prebind4, not deptrace's connect_error", names)
		}
		looked = true
	}, "--pair-loads", "tcp-short", "--pair-method", "streaming")
	all := strings.Join(stderr, "\n")
	if err != nil || !looked {
		t.Fatalf("overhead --pair-method streaming: %v (traced run seen: %v)\n%s", err, looked, all)
	}
	for _, want := range []string{"traced by bench compare's streaming method, collected every second", "| short-lived TCP | 5000 |"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr:\n%s", want, stdout.String(), all)
		}
	}
}

// runOverhead runs overhead's whole-machine pairs, one pair of 1 s runs
// with args, calling onLine with each line of its stderr as it comes, and
// returns its stdout, its stderr's lines and how it ended.
func runOverhead(t *testing.T, ctx context.Context, onLine func(cmd *exec.Cmd, line string), args ...string) (stdout *bytes.Buffer, stderr []string, err error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, binary, append([]string{"overhead", "--workloads", "", "--pairs", "1", "--pair-phase", "1s", "--min-reached", "0"}, args...)...)
	stdout = &bytes.Buffer{}
	cmd.Stdout = stdout
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(errPipe)
	for sc.Scan() {
		stderr = append(stderr, sc.Text())
		onLine(cmd, sc.Text())
	}
	return stdout, stderr, cmd.Wait()
}

// programsOf names the BPF programs process pid holds, from the prog_id
// lines of its file descriptors' fdinfo: this run's own programs, not
// another process's of the same name.
func programsOf(t *testing.T, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, fd := range fds {
		b, err := os.ReadFile(filepath.Join(dir, fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(line, "prog_id:")
			if !ok {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				t.Fatalf("%s/%s: %q", dir, fd.Name(), line)
			}
			p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
			if err != nil {
				continue // unloaded meanwhile
			}
			if info, err := p.Info(); err == nil {
				names = append(names, info.Name)
			}
			_ = p.Close() // a read-only handle
		}
	}
	return names
}

// hasPrefix reports whether a name starts with prefix: the watcher's
// programs have a suffix per variant (internal/dnswatch, variant.go).
func hasPrefix(names []string, prefix string) bool {
	return slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, prefix) })
}
