package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// binary is deptrace-bench built once for the tests that run it as a
// process (the benchmarks start their load generator as `binary load`).
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "deptrace-bench")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binary = filepath.Join(dir, "deptrace-bench")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build deptrace-bench: %v\n%s", err, out)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
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

// The subcommands kept their names and flags; bad input is one line,
// exit status 1.
func TestSubcommandsAndBadInput(t *testing.T) {
	stdout, _, code := run(t, nil, "--help")
	if code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, sub := range []string{"load", "serve", "overhead", "compare", "report"} {
		if !strings.Contains(stdout, "\n  "+sub+" ") {
			t.Errorf("--help lacks the %s subcommand:\n%s", sub, stdout)
		}
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"load", "--serve", "127.0.0.1:0", "--output", "xml"}, `deptrace-bench: invalid --output "xml": allowed table, json`},
		{[]string{"load"}, "deptrace-bench: missing --addr"},
		{[]string{"load", "--serve", "127.0.0.1:0", "--ports", "0"}, "deptrace-bench: invalid --ports 0: allowed 1 to 20000"},
		{[]string{"load", "--serve", "localhost"}, `deptrace-bench: invalid --serve "localhost": want ip:port`},
		{[]string{"load", "--serve", "127.0.0.1:0", "--clients", "70000"}, "deptrace-bench: invalid --clients 70000: allowed 0 to 65000"},
		{[]string{"load", "--serve", "127.0.0.1:0", "--concurrency", "0"}, "deptrace-bench: invalid --concurrency 0: allowed 1 to 10000"},
		{[]string{"load", "--serve", "127.0.0.1:0", "--msg-size", "0"}, "deptrace-bench: invalid --msg-size 0: allowed 1 to 65000"},
		{[]string{"load", "--serve", "127.0.0.1:0", "--workload", "sctp"}, `deptrace-bench: invalid --workload "sctp": allowed tcp-short, tcp-persistent, udp`},
		{[]string{"serve", "--ports", "20001"}, "deptrace-bench: invalid --ports 20001: allowed 1 to 20000"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--ports", "2"}, `deptrace-bench: invalid --addr "127.0.0.1:0" for 2 ports: give a first port with room for all`},
		{[]string{"load", "--addr", "127.0.0.1:1", "--duration", "1s"}, "deptrace-bench: no round trip completed: dial tcp 127.0.0.1:1: connect: connection refused (all "},
		{[]string{"load", "extra-arg"}, `deptrace-bench: load takes no arguments, got "extra-arg": flags start with -- (deptrace-bench load --help lists them)`},
		{[]string{"report", "/nonexistent-dir"}, "deptrace-bench: read results:"},
		{[]string{"overhead", "--hollow", "--pairs", "0"}, "deptrace-bench: --hollow replaces deptrace in the whole-machine pairs: give --pairs 1 or more"},
		{[]string{"overhead", "--dns", "--pairs", "0"}, "deptrace-bench: --dns adds the DNS watcher to deptrace in the whole-machine pairs: give --pairs 1 or more, without --hollow"},
		{[]string{"overhead", "--dns", "--hollow"}, "deptrace-bench: --dns adds the DNS watcher"},
		{[]string{"overhead", "--dns", "--dns-variant", "fast"}, `deptrace-bench: invalid --dns-variant "fast": allowed kctx, task, bare, call`},
		{[]string{"overhead", "--dns-variant", "kctx"}, "deptrace-bench: --dns-variant kctx chooses the DNS watcher's programs: give --dns too"},
		{[]string{"overhead", "--pair-method", "magic"}, `deptrace-bench: invalid --pair-method "magic": allowed polling, streaming, five-tuple, bundling`},
		{[]string{"overhead", "--pair-method", "streaming", "--dns"}, "deptrace-bench: --pair-method runs a bench compare method in place of deptrace in the whole-machine pairs: give --pairs 1 or more, without --hollow or --dns"},
		{[]string{"overhead", "--pair-method", "streaming", "--pairs", "0"}, "deptrace-bench: --pair-method runs a bench compare method"},
		{[]string{"overhead", "--pair-phase", "10ms"}, "deptrace-bench: invalid --pair-phase 10ms: allowed 1s to 1h"},
		{[]string{"overhead", "--pairs", "-1"}, "deptrace-bench: invalid --pairs -1: allowed 0 (skip the whole-machine measurement) to 1000"},
		{[]string{"overhead", "--pair-loads", "tcp-short,tcp"}, `deptrace-bench: invalid --pair-loads "tcp-short,tcp": "tcp" is not a load; allowed a comma list of tcp-short, tcp-persistent, udp, tcp-short-1000-hosts`},
		{[]string{"load", "--log-level", "loud"}, `deptrace-bench: invalid --log-level "loud": allowed debug, info, warn, error`},
		// A value that does not parse as the flag's type says the flag's
		// range, as one that parses and is out of it does.
		{[]string{"load", "--concurrency", "many"}, `deptrace-bench: invalid --concurrency "many": allowed 1 to 10000`},
		{[]string{"load", "--ports", "99999999999999999999"}, `deptrace-bench: invalid --ports "99999999999999999999": allowed 1 to 20000`},
		{[]string{"serve", "--ports", "x"}, `deptrace-bench: invalid --ports "x": allowed 1 to 20000`},
		{[]string{"overhead", "--pairs", "x"}, `deptrace-bench: invalid --pairs "x": allowed 0 (skip the whole-machine measurement) to 1000`},
		{[]string{"overhead", "--pair-phase", "x"}, `deptrace-bench: invalid --pair-phase "x": allowed 1s to 1h`},
		{[]string{"compare", "--attempts", "x"}, `deptrace-bench: invalid --attempts "x": allowed 1 to 20`},
		{[]string{"compare", "--tolerance", "x"}, `deptrace-bench: invalid --tolerance "x": allowed above 0 up to 1`},
		{[]string{"compare", "--min-reached", "x"}, `deptrace-bench: invalid --min-reached "x": allowed 0 (no check) to 1`},
	}
	for _, c := range cases {
		stdout, stderr, code := run(t, nil, c.args...)
		if code != 1 || stdout != "" || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.HasPrefix(stderr, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and one line starting %q", c.args, code, stdout, stderr, c.want)
		}
	}
}

// A short paced load against its own echo servers completes and reports
// JSON: the binary the benchmarks start as their load generator works.
func TestLoadRuns(t *testing.T) {
	stdout, stderr, code := run(t, nil, "load", "--serve", "127.0.0.1:0", "--workload", "tcp-short", "--duration", "1s", "--rate", "50", "--output", "json")
	if code != 0 {
		t.Fatalf("load: exit %d: %s", code, stderr)
	}
	var r struct {
		RoundTrips uint64 `json:"round_trips"`
		Errors     uint64 `json:"errors"`
		Edges      []struct {
			RoundTrips uint64 `json:"round_trips"`
		} `json:"edges"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("load output is not JSON: %v\n%s", err, stdout)
	}
	if r.RoundTrips == 0 || r.Errors != 0 || len(r.Edges) != 1 || r.Edges[0].RoundTrips != r.RoundTrips {
		t.Errorf("want round trips, no errors, one edge carrying them all:\n%s", stdout)
	}
}

// --pair-loads picks the pairs' loads by key, in their usual order.
func TestSelectPairedLoads(t *testing.T) {
	ls, err := selectPairedLoads("tcp-short-1000-hosts,tcp-short")
	if err != nil || len(ls) != 2 || ls[0].Name != "short-lived TCP" || ls[1].Clients != 1000 {
		t.Errorf("selectPairedLoads: %+v, %v; want short-lived TCP, then its 1,000 client hosts", ls, err)
	}
}
