package main

// These tests run the real deptrace binary, built once, as users do.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

var binary string

func TestMain(m *testing.M) {
	// The fleet test re-executes this binary under role names (symlinks),
	// so each role is a real process with its own command name.
	if role, ok := fleetRoles[filepath.Base(os.Args[0])]; ok {
		if err := role(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "deptrace-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // the capability test runs it as nobody
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binary = filepath.Join(dir, "deptrace")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build deptrace: %v\n%s", err, out)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestBadInputIsOneLineExitOne(t *testing.T) {
	cases := []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"trace", "--interval", "10ms"}, nil, "invalid --interval 10ms: allowed 100ms to 1h"},
		{[]string{"trace", "--output", "xml"}, nil, `invalid --output "xml": allowed table, jsonl`},
		{[]string{"trace", "--port", "0"}, nil, `invalid --port "0": allowed 1 to 65535`},
		{[]string{"trace", "--proto", "sctp"}, nil, `invalid --proto "sctp": allowed tcp, udp, unix, all`},
		{[]string{"trace", "--flow-map-size", "1"}, nil, "invalid --flow-map-size 1: allowed 64 to 4194304"},
		{[]string{"trace", "--duration", "-1s"}, nil, "invalid --duration -1s"},
		{[]string{"trace", "--netns", "no-such-ns-xyz"}, nil, `invalid --netns "no-such-ns-xyz"`},
		{[]string{"trace", "--netns", "/proc/self/ns/mnt"}, nil, `invalid --netns "/proc/self/ns/mnt": want all, self, an inode number, an ip-netns name or an nsfs path: /proc/self/ns/mnt is a namespace of another kind`},
		{[]string{"trace"}, []string{"DEPTRACE_INTERVAL=soon"}, `invalid DEPTRACE_INTERVAL="soon" for --interval`},
		{[]string{"trace", "--bogus"}, nil, "unknown flag: --bogus"},
		{[]string{"trace", "extra-arg"}, nil, `trace takes no arguments, got "extra-arg": flags start with -- (deptrace trace --help lists them)`},
		{[]string{"doctor", "--sample", "2h"}, nil, "invalid --sample 2h: allowed 0 to 1m"},
		{[]string{"graph", "--format", "json-v1", "--group-by", "host"}, nil, `invalid --group-by "host" with --format json-v1: format 1 is the process and service graph, never grouped; allowed --group-by with --format json, dot or mermaid`},
		{[]string{"trace"}, []string{"DEPTRACE_PROTO=bogus"}, `invalid --proto "bogus": allowed tcp, udp, unix, all (set from DEPTRACE_PROTO)`},
		{[]string{"look", "--depth", "abc", "x"}, nil, `invalid --depth "abc": allowed 0 (unlimited) or more`},
		{[]string{"agent"}, []string{"DEPTRACE_KEEP_TRACING=maybe"}, `invalid DEPTRACE_KEEP_TRACING="maybe" for --keep-tracing: allowed true or false`},
		{[]string{"agent", "--spool-max", "1KiB"}, nil, `invalid --spool-max "1KiB": allowed from 1MiB to 1024TiB`},
		{[]string{"agent", "--pin-path", "", "--host-id", "web/1"}, nil, `invalid --host-id "web/1": contains /`},
		{[]string{"agent", "--pin-path", "", "--host-id", "web 1"}, nil, `invalid --host-id "web 1": contains a space`},
	}
	for _, c := range cases {
		stdout, stderr, code := run(t, c.env, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], "deptrace: ") || !strings.Contains(lines[0], c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 1 and one line containing %q", c.env, c.args, code, stderr, c.want)
		}
		if stdout != "" {
			t.Errorf("%v: stdout %q on error", c.args, stdout)
		}
	}
}

// A command that takes no positional arguments says so, not that the
// argument is an unknown command: most often a flag lost its dashes.
func TestCommandsWithoutArgumentsSaySo(t *testing.T) {
	var visit func(c *cobra.Command)
	checked := 0
	visit = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			visit(sub)
		}
		if !c.Runnable() || c.Args == nil {
			return
		}
		if err := c.Args(c, nil); err != nil {
			return // takes arguments: look
		}
		checked++
		want := c.Name() + ` takes no arguments, got "extra-arg": flags start with -- (` + c.CommandPath() + ` --help lists them)`
		if err := c.Args(c, []string{"extra-arg"}); err == nil || err.Error() != want {
			t.Errorf("%s extra-arg: %v, want %q", c.CommandPath(), err, want)
		}
	}
	visit(newRootCmd())
	if checked != 7 {
		t.Errorf("checked %d commands, want 7: trace, doctor, agent, serve, cleanup, graph and diff", checked)
	}
}

// A --pin-path off bpffs is refused before the agent opens its store:
// the mistake leaves no database file behind.
func TestAgentRefusesAPinPathOffBPFFSBeforeItsStore(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "deptrace.db")
	for _, c := range []struct{ pin, want string }{
		{filepath.Join(dir, "pins"), `invalid --pin-path "` + filepath.Join(dir, "pins") + `": not on bpffs (` + dir + ` is not): allowed a directory on bpffs`},
		{"pins", `invalid --pin-path "pins": not an absolute path`},
		{"/deptrace", `invalid --pin-path "/deptrace": not under a bpffs mount`},
	} {
		_, stderr, code := run(t, nil, "agent", "--store", db, "--pin-path", c.pin)
		if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("agent --pin-path %s: exit %d, stderr %q; want exit 1 and one line containing %q", c.pin, code, stderr, c.want)
		}
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("the refused agents left %v in %s (err %v); want nothing", entries, dir, err)
	}
}

// Without capabilities the error names what is missing.
func TestUnprivilegedUserIsToldWhichCapability(t *testing.T) {
	testnet.RequireRoot(t) // we need root to become someone else
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "trace", "--duration", "1s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, output %q", err, out)
	}
	if got := strings.TrimSpace(string(out)); !strings.Contains(got, "missing capability CAP_BPF, CAP_PERFMON") || strings.Count(got, "\n") != 0 {
		t.Errorf("output %q", got)
	}
}

// proc is a running deptrace with its stderr collected line by line.
type proc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	mu     sync.Mutex
	stderr []string
	ready  chan struct{}
	done   chan error
}

func start(t *testing.T, args ...string) *proc {
	t.Helper()
	testnet.RequireRoot(t)
	return startReady(t, "msg=tracing", args...)
}

// collect reads stderr line by line and signals ready at the first line
// containing marker.
func (p *proc) collect(r io.Reader, marker string) {
	s := bufio.NewScanner(r)
	once := sync.Once{}
	for s.Scan() {
		p.mu.Lock()
		p.stderr = append(p.stderr, s.Text())
		p.mu.Unlock()
		if strings.Contains(s.Text(), marker) {
			once.Do(func() { close(p.ready) })
		}
	}
	p.done <- p.cmd.Wait()
}

func (p *proc) errText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.stderr, "\n")
}

func (p *proc) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("deptrace: %v\n%s", err, p.errText())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("deptrace did not exit")
	}
}

func tcpTraffic(t *testing.T, nw *testnet.Network, port, n int) {
	t.Helper()
	a, b := nw.Hosts[0], nw.Hosts[1]
	ln := b.Listen(t, "tcp4", fmt.Sprintf("%s:%d", b.IPv4, port))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("pong")) // the peer: a lost reply fails the client
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := a.Dial("tcp4", fmt.Sprintf("%s:%d", b.IPv4, port))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("ping!")) // a short write shows in the counts checked
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

func TestTraceJSONL(t *testing.T) {
	nw := testnet.New(t, 2)
	p := start(t, "trace", "--output", "jsonl", "--duration", "2s", "--proto", "tcp", "--port", "8443")
	tcpTraffic(t, nw, 8443, 5)
	p.wait(t)

	a, b := nw.Hosts[0], nw.Hosts[1]
	var conns, rttSamples = map[uint32]uint64{}, map[uint32]uint64{}
	listeners := 0
	for _, line := range strings.Split(strings.TrimSpace(p.stdout.String()), "\n") {
		var f tracer.Flow
		var avg struct {
			RTTAvgUs *uint64 `json:"rtt_avg_us"`
		}
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if err := json.Unmarshal([]byte(line), &avg); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if f.Kind == tracer.KindListener {
			if f.Port != 8443 || f.NetNS != b.Inode {
				t.Errorf("listener record %s", line)
			}
			listeners++
			continue
		}
		if f.Kind != tracer.KindFlow || f.Proto != "tcp" || f.Port != 8443 {
			t.Errorf("filter let through %+v", f)
		}
		if f.NetNS == a.Inode && f.Direction != "outbound" || f.NetNS == b.Inode && f.Direction != "inbound" {
			t.Errorf("direction: %+v", f)
		}
		conns[f.NetNS] += f.Connections
		rttSamples[f.NetNS] += f.RTTSamples
		if avg.RTTAvgUs == nil || *avg.RTTAvgUs != f.RTTAvgUs() || f.RTTSamples > 0 && (f.RTTMinUs > *avg.RTTAvgUs || *avg.RTTAvgUs > f.RTTMaxUs) {
			t.Errorf("rtt_avg_us missing, not rtt_sum_us / rtt_samples, or outside min to max: %s", line)
		}
	}
	if conns[a.Inode] != 5 || conns[b.Inode] != 5 {
		t.Errorf("connections per host %v; want 5 on %d and %d\n%s", conns, a.Inode, b.Inode, p.stdout.String())
	}
	// Each connection moved bytes, so each end read its RTT at its close.
	if rttSamples[a.Inode] < 5 || rttSamples[b.Inode] < 5 {
		t.Errorf("rtt samples per host %v; want at least 5 (one per connection's close) on %d and %d\n%s", rttSamples, a.Inode, b.Inode, p.stdout.String())
	}
	if listeners == 0 {
		t.Errorf("no listener record for the server's port 8443:\n%s", p.stdout.String())
	}
}

// SIGTERM prints the last partial interval: with a one-hour interval,
// everything printed comes from that final flush. So does SIGHUP, which a
// closed terminal or ssh session sends.
func TestSigtermFlushesTheLastInterval(t *testing.T) {
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			nw := testnet.New(t, 2)
			var p *proc
			withHangupHandled(func() { p = start(t, "trace", "--interval", "1h", "--netns", nw.Hosts[1].Name) })
			port := 9000 + 10*i
			tcpTraffic(t, nw, port, 3)
			p.cmd.Process.Signal(sig)
			p.wait(t)
			out := p.stdout.String()
			want := fmt.Sprintf("%s:%d  <--  %s:many", nw.Hosts[1].IPv4, port, nw.Hosts[0].IPv4)
			if !strings.Contains(out, want) || !strings.HasPrefix(out, "TIME") {
				t.Errorf("table after %s lacks %q:\n%s", sig, want, out)
			}
			if strings.Contains(out, nw.Hosts[0].IPv4.String()+":many  -->") {
				t.Errorf("--netns %s printed flows of another namespace:\n%s", nw.Hosts[1].Name, out)
			}
		})
	}
}

// Under nohup (SIGHUP ignored when it started) trace goes on through a
// hangup: it still counts what comes after it, and SIGTERM stops it.
func TestHangupUnderNohupGoesOn(t *testing.T) {
	nw := testnet.New(t, 2)
	testnet.RequireRoot(t)
	p := startReadyVia(t, []string{"nohup"}, nil, "msg=tracing", "trace", "--interval", "1h", "--netns", nw.Hosts[1].Name)
	tcpTraffic(t, nw, 9020, 2)
	p.cmd.Process.Signal(syscall.SIGHUP)
	// A stop takes well under a second; an ignored hangup never ends it.
	select {
	case err := <-p.done:
		t.Fatalf("trace under nohup stopped on SIGHUP (%v)\n%s", err, p.stdout.String())
	case <-time.After(3 * time.Second):
	}
	tcpTraffic(t, nw, 9021, 2)
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t) // a hangup's default action would end it with "signal: hangup"
	out := p.stdout.String()
	for _, port := range []int{9020, 9021} {
		if want := fmt.Sprintf("%s:%d  <--  %s:many", nw.Hosts[1].IPv4, port, nw.Hosts[0].IPv4); !strings.Contains(out, want) {
			t.Errorf("table lacks %q (traffic before and after the hangup):\n%s", want, out)
		}
	}
}

// withHangupHandled runs start, which starts a deptrace, with SIGHUP
// handled by this process, so that the child gets its default action
// (exec resets handled signals) even where the test runner was started
// under nohup; Reset then puts the runner's disposition back (the runtime
// restores an ignore it found at start).
func withHangupHandled(start func()) {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	defer signal.Reset(syscall.SIGHUP)
	start()
}

// A namespace created after trace started shows in the table by its
// `ip netns` name, not its inode: the table reads the names at each
// interval.
func TestTableNamesNamespacesCreatedAfterStart(t *testing.T) {
	p := start(t, "trace", "--interval", "1h")
	nw := testnet.New(t, 2)
	tcpTraffic(t, nw, 9001, 2)
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)
	out := p.stdout.String()
	server := fmt.Sprintf("%s:9001  <--  %s:many", nw.Hosts[1].IPv4, nw.Hosts[0].IPv4)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, server) {
			if fields := strings.Fields(line); fields[len(fields)-1] != nw.Hosts[1].Name {
				t.Errorf("NETNS of the server's row is %q, want %q:\n%s", fields[len(fields)-1], nw.Hosts[1].Name, out)
			}
			return
		}
	}
	t.Errorf("table lacks %q:\n%s", server, out)
}

func TestTinyMapLossIsReported(t *testing.T) {
	nw := testnet.New(t, 2)
	p := start(t, "trace", "--flow-map-size", "64", "--duration", "2s", "--output", "jsonl")
	a, b := nw.Hosts[0], nw.Hosts[1]
	pc := a.ListenPacket(t, "udp4", a.IPv4.String()+":0")
	// More new flows than the map (64) and the spill behind it (256 an
	// interval) hold, even split across two intervals.
	for port := 30000; port < 31500; port++ {
		_, _ = pc.WriteTo([]byte("x"), &net.UDPAddr{IP: b.IPv4, Port: port})
	}
	p.wait(t)
	errText := p.errText()
	if !strings.Contains(errText, "events lost this interval") || !strings.Contains(errText, "flow_map_full=") ||
		!strings.Contains(errText, "raise --flow-map-size (now 64)") {
		t.Errorf("loss not reported:\n%s", errText)
	}
}

func TestDoctor(t *testing.T) {
	testnet.RequireRoot(t)
	stdout, stderr, code := run(t, nil, "doctor", "--sample", "100ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// Columns are padded to the widest cell: match a row's fields, not its spaces.
	// The DNS watcher started with doctor's tracer, as trace starts it:
	// in the tracer's calls where the kernel has the byte tracepoints.
	dnsWhere := `variant call, in the tracer's send and receive calls`
	if !kernel.Has("btf_trace_sock_send_length") {
		dnsWhere = `variant \w+, per packet \(the tracer has no send and receive tracepoints here\)`
	}
	for _, want := range []string{`active +tp_btf/inet_sock_set_state`, `active +iter/tcp`, `standby +fexit/inet_sendmsg`, `LOSS COUNTERS`, `active +iter/bpf_sk_storage_map`,
		`(off|standby) +tracepoint/syscalls/sys_exit_connect`, `flow map full +0`, `sock storage failed +0`, `listeners in a 100ms sample`,
		`dns watcher +with the tracer \(as trace runs it\): ` + dnsWhere + `; resolver notes: the tracer's sendmsg programs\n`} {
		if !regexp.MustCompile(want).MatchString(stdout) {
			t.Errorf("doctor output lacks %q:\n%s", want, stdout)
		}
	}
	// Allowed, the syscall tracepoint stands in where fexit is missing.
	stdout, stderr, code = run(t, nil, "doctor", "--sample", "100ms", "--syscall-tracepoints")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{`(replaced|active) +fexit/unix_stream_connect`, `(active|standby) +tracepoint/syscalls/sys_exit_connect`} {
		if !regexp.MustCompile(want).MatchString(stdout) {
			t.Errorf("doctor --syscall-tracepoints output lacks %q:\n%s", want, stdout)
		}
	}
}
