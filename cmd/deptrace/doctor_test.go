package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/identity"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

// The kernel's ENOTSUPP on an fexit attach is explained in words on arm64,
// where Debian 12's kernels lack fentry/fexit; other refusals are left as
// the kernel gave them.
func TestExplainMissing(t *testing.T) {
	fexit := tracer.Hook{Hook: "fexit/inet_sendmsg", Reason: "attach: create tracing link: not supported"}
	if got := explainMissing(fexit, "arm64"); !strings.Contains(got, "CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS") {
		t.Errorf("arm64 fexit ENOTSUPP: got %q, want the missing kernel option named", got)
	}
	if got := explainMissing(fexit, "amd64"); got == "" || strings.Contains(got, "arm64") {
		t.Errorf("amd64 fexit ENOTSUPP: got %q, want a generic explanation", got)
	}
	other := tracer.Hook{Hook: "fexit/inet_sendmsg", Reason: "load: permission denied"}
	if got := explainMissing(other, "arm64"); got != "" {
		t.Errorf("another refusal: got %q, want none", got)
	}
	tp := tracer.Hook{Hook: "tp_btf/sock_send_length", Reason: "attach: not supported"}
	if got := explainMissing(tp, "arm64"); got != "" {
		t.Errorf("a tracepoint: got %q, want none", got)
	}
}

// doctor names the DNS watcher's variant, what it loses and why the
// better ones were refused, and says plainly when none loads.
func TestDoctorDNS(t *testing.T) {
	v := dnswatch.Variants
	refused := errors.New("load program: permission denied: unknown func bpf_get_current_pid_tgid#14")
	ownNotesRefused := v[2] // bare: loses the querying process whatever notes it reads
	ownNotesRefused.NotesLost = "queries sent with sendto()"
	ownNotesRefused.Lost += "; " + ownNotesRefused.NotesLost
	cases := []struct {
		name  string
		tried []dnswatch.VariantResult
		err   error
		want  []string
	}{
		{"first", []dnswatch.VariantResult{{Variant: v[0]}}, nil,
			[]string{"dns watcher   loads: variant " + v[0].Name, "nothing lost"}},
		{"per call", []dnswatch.VariantResult{{Variant: v[3]}}, nil,
			[]string{"dns watcher   loads: variant call", "run by the tracer's send and receive programs", "nothing lost"}},
		{"per call refused", []dnswatch.VariantResult{{Variant: v[3], Err: refused}, {Variant: v[0]}}, nil,
			[]string{"variant call refused", "loads: variant " + v[0].Name}},
		{"fallback", []dnswatch.VariantResult{{Variant: v[0], Err: refused}, {Variant: v[1], Err: refused}, {Variant: v[2]}}, nil,
			[]string{"variant " + v[0].Name + " refused", "bpf_get_current_pid_tgid", "variant " + v[1].Name + " refused", "loads: variant " + v[2].Name, "lost: " + v[2].Lost}},
		{"own notes refused", []dnswatch.VariantResult{{Variant: ownNotesRefused}}, nil,
			[]string{"loads: variant " + v[2].Name, "; lost: " + v[2].Lost + "; lost on its own (its sendmsg programs refused; the next line says whether the tracer's resolver notes stand in): queries sent with sendto()\n"}},
		{"none", []dnswatch.VariantResult{{Variant: v[0], Err: refused}, {Variant: v[1], Err: refused}, {Variant: v[2], Err: refused}}, errors.New("dns: all refused"),
			[]string{"CANNOT LOAD (no variant loads)", "without remote names"}},
		{"before loading", nil, errors.New("raise memlock: operation not permitted"),
			[]string{"CANNOT LOAD (raise memlock: operation not permitted)"}},
		{"refused in lines", []dnswatch.VariantResult{{Variant: v[0], Err: errors.New("load program:\n\tline 1\n\tline 2")}, {Variant: v[1]}}, nil,
			[]string{"variant " + v[0].Name + " refused (needs " + v[0].Needs + "): load program: line 1; line 2\n"}},
	}
	for _, c := range cases {
		var out strings.Builder
		doctorDNS(&out, func() ([]dnswatch.VariantResult, error) { return c.tried, c.err })
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: output %q lacks %q", c.name, out.String(), w)
			}
		}
		if c.err == nil && strings.Contains(out.String(), "CANNOT") {
			t.Errorf("%s: output %q says it cannot load", c.name, out.String())
		}
	}
}

// doctor names an optional capability the process lacks and what is lost
// without it; trace warns of it at start. Run as root with CAP_SYS_PTRACE
// dropped (setpriv, util-linux), and with every capability: no such line.
func TestDoctorAndTraceNameAMissingOptionalCapability(t *testing.T) {
	testnet.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) is needed to drop a capability: %v", err)
	}
	const line = "without CAP_SYS_PTRACE: network namespaces found only through processes deptrace may not inspect"
	if stdout, stderr, code := run(t, nil, "doctor", "--sample", "0"); code != 0 || strings.Contains(stdout, "without CAP_") {
		t.Fatalf("doctor with every capability: exit %d, %s\n%s", code, stderr, stdout)
	}
	drop := []string{"--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", binary}
	out, err := exec.Command(setpriv, append(drop, "doctor", "--sample", "0")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "capabilities  "+line) {
		t.Errorf("doctor without CAP_SYS_PTRACE (%v):\n%s", err, out)
	}
	out, err = exec.Command(setpriv, append(drop, "trace", "--duration", "1s")...).CombinedOutput()
	if err != nil || !regexp.MustCompile(`level=WARN msg="capability missing: network namespaces found only through processes deptrace may not inspect[^"]*" .*capability=CAP_SYS_PTRACE`).Match(out) {
		t.Errorf("trace without CAP_SYS_PTRACE (%v):\n%s", err, out)
	}
}

// Every doctor line is one line, so that `grep ^store` gets the whole
// reason: pgx lists each address it tried on lines of their own.
func TestDoctorStoreUnreachableIsOneLine(t *testing.T) {
	var out strings.Builder
	doctorStore(context.Background(), &out, "postgres://nobody@127.0.0.1:1/x", filepath.Join(t.TempDir(), "spool.jsonl"))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "store         UNREACHABLE: ") || !strings.Contains(lines[0], "127.0.0.1:1 (127.0.0.1): dial error") {
		t.Errorf("want a store line naming the refused dial, then the spool's:\n%s", out.String())
	}
}

// identitySockets makes, in a temp dir, a socket path with nothing there,
// one holding a regular file, and one where an HTTP server answers
// Docker's /version as the Engine API does.
func identitySockets(t *testing.T) (missing, file, answering string) {
	t.Helper()
	dir := t.TempDir()
	missing, file, answering = filepath.Join(dir, "missing.sock"), filepath.Join(dir, "passwd"), filepath.Join(dir, "docker.sock")
	if err := os.WriteFile(file, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", answering)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/version", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"Version":"99.0.1","ApiVersion":"1.99"}`))
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }() // ends with Close
	t.Cleanup(func() { srv.Close() })
	return missing, file, answering
}

// doctor's identity lines: one per runtime, saying whether its socket is
// there and answers, and what is lost where it does not; a path that
// holds no socket is said to be one (and never connected to).
func TestDoctorIdentitySources(t *testing.T) {
	missing, file, answering := identitySockets(t)
	cfg := identity.Config{DockerSocket: answering, PodmanSocket: file, ContainerdSocket: missing, Timeout: 2 * time.Second}
	var out strings.Builder
	doctorSources(context.Background(), &out, cfg, nil)
	want := "identity      docker " + answering + ": answers (version 99.0.1, API 1.99)\n" +
		"identity      podman " + file + ": UNREACHABLE: " + file + " is not a socket (a regular file); its containers would be named by id only\n" +
		"identity      containerd " + missing + ": no socket (containerd does not run here, or listens elsewhere: --containerd-socket)\n" +
		"identity      cri-o off (--crio-socket \"\")\n"
	if out.String() != want {
		t.Errorf("got\n%swant\n%s", out.String(), want)
	}
	// Containers of a runtime whose socket is not there are named by id only.
	out.Reset()
	cfg = identity.Config{DockerSocket: missing, Timeout: 2 * time.Second}
	doctorSources(context.Background(), &out, cfg, map[string]int{identity.RuntimeDocker: 3})
	if want := "identity      docker " + missing + ": NO SOCKET, but 3 docker containers run here, named by id only (--docker-socket says where it listens)\n"; !strings.HasPrefix(out.String(), want) {
		t.Errorf("got\n%swant first\n%s", out.String(), want)
	}
}

// doctor takes the runtimes' sockets as trace and agent do and prints
// its identity lines, the cgroup layout first, before loading anything.
func TestDoctorIdentityLines(t *testing.T) {
	testnet.RequireRoot(t)
	missing, file, _ := identitySockets(t)
	stdout, stderr, code := run(t, []string{"DEPTRACE_PODMAN_SOCKET=" + file}, "doctor", "--sample", "0",
		"--docker-socket", missing, "--containerd-socket", "", "--crio-socket", "")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		`\nidentity      cgroup v2 at /\S+ \((unified|hybrid: [^)]*)\): \d+ cgroups?, \d+ systemd units?; containers: [^\n]+\n` +
			`identity      docker ` + regexp.QuoteMeta(missing) + `: no socket \(docker does not run here, or listens elsewhere: --docker-socket\)\n` +
			`identity      podman ` + regexp.QuoteMeta(file) + `: UNREACHABLE: ` + regexp.QuoteMeta(file) + ` is not a socket \(a regular file\); its containers would be named by id only\n` +
			`identity      containerd off \(--containerd-socket ""\)\n` +
			`identity      cri-o off \(--crio-socket ""\)\n`,
	} {
		if !regexp.MustCompile(want).MatchString(stdout) {
			t.Errorf("doctor output lacks %q:\n%s", want, stdout)
		}
	}
}
