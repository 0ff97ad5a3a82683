package main

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/testnet"
)

const (
	unitFile    = "../../packaging/deptrace.service"
	defaultFile = "../../packaging/deptrace.default"
)

// unitDirective returns the values of one directive of the unit file.
func unitDirective(t *testing.T, name string) []string {
	t.Helper()
	f, err := os.Open(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), name+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// The settings file names every flag of `deptrace agent` (its own and the
// global ones) by its environment variable, each commented out with its
// default, and nothing else.
func TestDefaultFileListsEveryAgentFlag(t *testing.T) {
	root := newRootCmd()
	agent, _, err := root.Find([]string{"agent"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	add := func(f *pflag.Flag) {
		if f.Name != "help" {
			want[cli.EnvName(f.Name)] = f.DefValue
		}
	}
	agent.Flags().VisitAll(add)
	root.PersistentFlags().VisitAll(add)

	data, err := os.ReadFile(defaultFile)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^#(DEPTRACE_[A-Z_]+)=(.*)$`).FindAllStringSubmatch(string(data), -1) {
		got[m[1]] = m[2]
	}
	if regexp.MustCompile(`(?m)^DEPTRACE_`).Match(data) {
		t.Errorf("%s sets a variable: every line must stay commented so the defaults live in one place", defaultFile)
	}
	for env, def := range want {
		v, ok := got[env]
		switch {
		case !ok:
			t.Errorf("%s lacks #%s=%s", defaultFile, env, def)
		case v != def && !sameDuration(v, def):
			t.Errorf("%s: #%s=%s, but the default is %s", defaultFile, env, v, def)
		}
	}
	for env := range got {
		if _, ok := want[env]; !ok {
			t.Errorf("%s names %s, which is no flag of deptrace agent", defaultFile, env)
		}
	}
}

// The unit grants exactly the capabilities it bounds, and they are the ones
// the documentation names.
func TestUnitCapabilities(t *testing.T) {
	amb, bound := unitDirective(t, "AmbientCapabilities"), unitDirective(t, "CapabilityBoundingSet")
	if len(amb) != 1 || len(bound) != 1 || amb[0] != bound[0] {
		t.Fatalf("AmbientCapabilities %q and CapabilityBoundingSet %q must be one identical line each", amb, bound)
	}
	caps := strings.Fields(amb[0])
	slices.Sort(caps)
	want := []string{"CAP_BPF", "CAP_DAC_OVERRIDE", "CAP_NET_ADMIN", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE"}
	if !slices.Equal(caps, want) {
		t.Errorf("unit capabilities %v, want %v", caps, want)
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range want {
		if !strings.Contains(string(doc), c) {
			t.Errorf("docs/operations.md does not explain %s", c)
		}
	}
	for _, d := range []string{"NoNewPrivileges=yes", "Restart=on-failure", "StateDirectory=deptrace", "EnvironmentFile=-/etc/default/deptrace", "ExecStart=/usr/bin/deptrace agent"} {
		name, val, _ := strings.Cut(d, "=")
		if v := unitDirective(t, name); len(v) != 1 || v[0] != val {
			t.Errorf("unit: %s=%q, want %s", name, v, d)
		}
	}
}

var capNumbers = map[string]uintptr{"CAP_DAC_OVERRIDE": 1, "CAP_NET_ADMIN": 12, "CAP_SYS_PTRACE": 19, "CAP_SYS_ADMIN": 21, "CAP_PERFMON": 38, "CAP_BPF": 39}

// The agent works as an unprivileged user holding only the unit's ambient
// capabilities: it loads, attaches, finds the namespaces, and counts the
// traffic of two test hosts exactly. Without one of them it stops with an
// error naming it.
func TestAgentRunsWithTheUnitsCapabilitiesOnly(t *testing.T) {
	testnet.RequireRoot(t)
	var caps []uintptr
	for _, c := range strings.Fields(unitDirective(t, "AmbientCapabilities")[0]) {
		n, ok := capNumbers[c]
		if !ok {
			t.Fatalf("unknown capability %s in the unit", c)
		}
		caps = append(caps, n)
	}
	state := t.TempDir()
	if err := os.Chmod(filepath.Dir(state), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	asNobody := func(ambient []uintptr) *syscall.SysProcAttr {
		return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, AmbientCaps: ambient, Pdeathsig: syscall.SIGKILL}
	}

	// One capability short: a one-line error naming it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var noSysAdmin []uintptr
	for _, c := range caps {
		if c != capNumbers["CAP_SYS_ADMIN"] {
			noSysAdmin = append(noSysAdmin, c)
		}
	}
	cmd := exec.CommandContext(ctx, binary, "agent", "--store", filepath.Join(state, "x.db"), "--spool", filepath.Join(state, "x.spool"), "--metrics-listen", "")
	cmd.SysProcAttr = asNobody(noSysAdmin)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "missing capability CAP_SYS_ADMIN") {
		t.Errorf("agent without CAP_SYS_ADMIN: %v\n%s", err, out)
	}

	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	p := startAs(t, asNobody(caps), "msg=\"agent started\"", "agent", "--netns", "all", "--interval", "1s", "--host-id", "captest", "--pin-path", testPinPath(t, "captest"),
		"--store", filepath.Join(state, "deptrace.db"), "--spool", filepath.Join(state, "spool.jsonl"), "--metrics-listen", "127.0.0.1:0")
	m := regexp.MustCompile(`msg="metrics served" .*url=(\S+)`).FindStringSubmatch(p.errText())
	if m == nil {
		t.Fatalf("no metrics URL in the agent's log:\n%s", p.errText())
	}
	const port, n = 7310, 4
	pingPong(t, a, b, port, n)
	comm, _ := os.ReadFile("/proc/self/comm")
	proc := strings.TrimSpace(string(comm))
	key := fmt.Sprintf(`deptrace_outbound_connections_total{host="captest/%s",port="%d",process=%q,proto="tcp",remote="%s"}`, a.Name, port, proc, b.IPv4)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := scrapeMetrics(t, m[1])[key]
		if got == n {
			break
		}
		if got > n || time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %d\nagent log:\n%s", key, got, n, p.errText())
		}
		time.Sleep(500 * time.Millisecond)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t)
	if strings.Contains(p.errText(), "level=WARN") || strings.Contains(p.errText(), "level=ERROR") {
		t.Errorf("agent warned with the unit's capabilities:\n%s", p.errText())
	}
	if st, err := os.Stat(filepath.Join(state, "deptrace.db")); err != nil || st.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Errorf("store not written by the unprivileged user: %v", err)
	}
}

// startAs is startReady with the process's credentials and capabilities.
func startAs(t *testing.T, attr *syscall.SysProcAttr, ready string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	p := &proc{ready: make(chan struct{}), done: make(chan error, 1)}
	p.cmd = exec.CommandContext(ctx, binary, args...)
	p.cmd.SysProcAttr = attr
	p.cmd.Stdout = &p.stdout
	errPipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cmd.Process.Kill() })
	go p.collect(errPipe, ready)
	select {
	case <-p.ready:
	case err := <-p.done:
		t.Fatalf("deptrace %v exited: %v\n%s", args, err, p.errText())
	case <-time.After(30 * time.Second):
		t.Fatalf("deptrace %v not ready\n%s", args, p.errText())
	}
	return p
}

// make package builds a .deb and a tarball with the same files; the .deb
// installs into a scratch root (maintainer scripts included), the unit it
// installs passes systemd-analyze verify, the installed binary runs, and
// it removes cleanly.
func TestPackage(t *testing.T) {
	testnet.RequireRoot(t) // dpkg --root with ownership as in the package
	for _, tool := range []string{"make", "dpkg", "dpkg-deb", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to build and check the package: %v", tool, err)
		}
	}
	dist := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mk := exec.CommandContext(ctx, "make", "-C", "../..", "package", "DIST="+dist, "VERSION=1.2.3~test")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make package: %v\n%s", err, out)
	}
	deb := filepath.Join(dist, "deptrace_1.2.3~test_"+goarch(t)+".deb")
	tarball := filepath.Join(dist, "deptrace_1.2.3~test_linux_"+goarch(t)+".tar.gz")
	want := []string{"etc/default/deptrace", "usr/bin/deptrace", "usr/lib/systemd/system/deptrace.service",
		"usr/share/doc/deptrace/README.md", "usr/share/doc/deptrace/metrics.md", "usr/share/doc/deptrace/operations.md",
		"usr/share/doc/deptrace/examples/deptrace-rules.yml"}
	list := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	debFiles, tarFiles := list("dpkg-deb", "--contents", deb), list("tar", "-tzvf", tarball)
	for _, f := range want {
		if !strings.Contains(debFiles, "./"+f+"\n") {
			t.Errorf(".deb lacks %s:\n%s", f, debFiles)
		}
		if !strings.Contains(tarFiles, "_linux_"+goarch(t)+"/"+f+"\n") {
			t.Errorf("tarball lacks %s:\n%s", f, tarFiles)
		}
	}
	if !strings.Contains(list("dpkg-deb", "--field", deb, "Version"), "1.2.3~test") {
		t.Errorf("package version is not the one asked for")
	}

	// A scratch root with its own dpkg database.
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dpkg := func(args ...string) string {
		return list("dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--force-not-root", "--log=/dev/null"}, args...)...)
	}
	dpkg("--install", deb)
	if !strings.Contains(dpkg("--status", "deptrace"), "Status: install ok installed") {
		t.Fatalf("deptrace not installed in %s", root)
	}
	bin := filepath.Join(root, "usr/bin/deptrace")
	if out := list(bin, "--help"); !strings.Contains(out, "agent") || !strings.Contains(out, "--log-format") {
		t.Errorf("installed deptrace --help:\n%s", out)
	}
	if out := list(bin, "--version"); !strings.Contains(out, "1.2.3~test") {
		t.Errorf("installed deptrace --version: %s", out)
	}
	if f, err := elf.Open(bin); err != nil {
		t.Error(err)
	} else {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("installed binary is dynamically linked (%v)", p.Type)
			}
		}
		f.Close()
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		// verify checks ExecStart, so point it at the installed binary.
		unit, _ := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system/deptrace.service"))
		check := filepath.Join(t.TempDir(), "deptrace.service")
		if err := os.WriteFile(check, []byte(strings.ReplaceAll(string(unit), "/usr/bin/deptrace", bin)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("systemd-analyze", "verify", check).CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}
	dpkg("--purge", "deptrace")
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Errorf("binary left after purge: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/default/deptrace")); !os.IsNotExist(err) {
		t.Errorf("settings file left after purge: %v", err)
	}
}

func goarch(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOARCH").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

func sameDuration(a, b string) bool {
	da, errA := time.ParseDuration(a)
	db, errB := time.ParseDuration(b)
	return errA == nil && errB == nil && da == db
}
