package realtest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These run without root: programs in this namespace (h nil).

func TestRunReturnsExitCodeAndOutput(t *testing.T) {
	code, out, errOut := Run(t, nil, 10*time.Second, "sh", "-c", `echo "out $LC_ALL"; echo err >&2; exit 3`)
	if code != 3 || out != "out C\n" || errOut != "err\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 3, %q, %q", code, out, errOut, "out C\n", "err\n")
	}
}

func TestDaemonStopAndProcesses(t *testing.T) {
	dir := t.TempDir()
	// A shell that prints, then waits on a child sleep: two processes.
	d := StartDaemon(t, nil, dir, "shell", syscall.SIGTERM, "sh", "-c", "echo started; sleep 60 & wait")
	var kids []int
	if err := pollFor(5*time.Second, func() bool {
		kids = Children(d.PID)
		return len(kids) == 1 && Comm(kids[0]) == "sleep" && strings.Contains(d.Output(), "started")
	}); err != nil {
		t.Fatalf("children %v, output %q: want one sleep and %q", kids, d.Output(), "started")
	}
	d.MustRun(t)
	if got := Descendants(os.Getpid()); !slices.Contains(got, kids[0]) {
		t.Fatalf("descendants of the test %v lack the daemon's child %d", got, kids[0])
	}
	if st, ppid, err := ProcStat(kids[0]); err != nil || ppid != d.PID || st != 'S' {
		t.Fatalf("sleep: state %c ppid %d (%v); want S, %d", st, ppid, err, d.PID)
	}
	if err := syscall.Kill(d.PID, syscall.SIGSTOP); err != nil { // Stop must wake it first
		t.Fatal(err)
	}
	d.Stop(t, syscall.SIGTERM)
	if !d.Exited() {
		t.Fatal("the daemon runs after Stop")
	}
	if err := pollFor(5*time.Second, func() bool { return Comm(kids[0]) == "" }); err != nil {
		t.Fatalf("the daemon's child %d outlived Stop", kids[0])
	}
	if b, err := os.ReadFile(filepath.Join(dir, "shell.out")); err != nil || string(b) != "started\n" {
		t.Fatalf("shell.out: %q (%v)", b, err)
	}
	d.Stop(t, syscall.SIGTERM) // a second Stop does nothing
}

func pollFor(limit time.Duration, cond func() bool) error {
	for end := time.Now().Add(limit); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			return os.ErrDeadlineExceeded
		}
	}
	return nil
}

func TestParseStat(t *testing.T) {
	st, ppid, err := parseStat(7, "7 (a) b (c)) T 42 7 7 0 -1")
	if err != nil || st != 'T' || ppid != 42 {
		t.Fatalf("got %c %d %v; want T 42", st, ppid, err)
	}
	if _, _, err := parseStat(7, "7 (a"); err == nil {
		t.Fatal("no error for a truncated stat line")
	}
}

func TestRulePackets(t *testing.T) {
	listing := `table ip t {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 7004 counter packets 3 bytes 180 reject with icmp admin-prohibited
		tcp dport 7006 counter packets 12 bytes 720 drop
	}
}`
	if n, err := rulePackets(listing, "dport 7006"); err != nil || n != 12 {
		t.Fatalf("dport 7006: %d (%v); want 12", n, err)
	}
	if _, err := rulePackets(listing, "dport 9"); err == nil || !strings.Contains(err.Error(), `no counter on a rule with "dport 9"`) {
		t.Fatalf("dport 9: error %v; want no counter", err)
	}
}

func TestWriteNginxConf(t *testing.T) {
	dir := t.TempDir()
	path := WriteNginxConf(t, dir, "\tserver { listen 127.0.0.1:8081; access_log {dir}/a.log; }")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "\tscgi_temp_path " + dir + "/scgi;\n\tserver { listen 127.0.0.1:8081; access_log " + dir + "/a.log; }\n}\n"
	if path != filepath.Join(dir, "nginx.conf") || !strings.HasSuffix(string(b), want) {
		t.Fatalf("%s:\n%s\nwant it to end with:\n%s", path, b, want)
	}
}
