package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// root builds a command tree whose "run" subcommand logs one line at each
// level and records its --size flag.
func root(out *bytes.Buffer, size *int) *cobra.Command {
	r := &cobra.Command{Use: "deptrace"}
	Configure(r)
	var sizeMax int
	sub := &cobra.Command{Use: "run", RunE: func(*cobra.Command, []string) error {
		if *size < 1 {
			return fmt.Errorf("invalid --size %d: allowed 1 or more", *size)
		}
		if sizeMax < 2 {
			return fmt.Errorf("invalid --size-max %d: allowed 2 or more", sizeMax)
		}
		slog.Debug("dbg line", "component", "test")
		slog.Info("info line", "component", "test")
		slog.Warn("warn line", "component", "test")
		return nil
	}}
	sub.Flags().IntVar(size, "size", 1, "a size")
	sub.Flags().IntVar(&sizeMax, "size-max", 10, "a larger size")
	sub.Flags().Duration("every", time.Second, "a period")
	sub.Flags().Uint32("slots", 64, "a count")
	sub.Flags().Uint32("map-size", 64, "a count the command bounds")
	SetAllowed(sub.Flags(), "map-size", "64 to 4194304")
	sub.Flags().Var(&rangedInt{}, "edges", "a count its value bounds")
	other := &cobra.Command{Use: "serve", RunE: func(*cobra.Command, []string) error { return nil }}
	other.Flags().String("store", "", "a store")
	r.AddCommand(sub, other)
	r.SetErr(out)
	r.SetOut(out)
	return r
}

func TestLoggingFlagsAndEnv(t *testing.T) {
	defer slog.SetDefault(slog.Default())
	cases := []struct {
		name    string
		env     map[string]string
		args    []string
		wantErr string
		notErr  string // and the error does not contain it
		check   func(t *testing.T, out string)
	}{
		{name: "default text info", args: []string{"run"}, check: func(t *testing.T, out string) {
			if !strings.Contains(out, `level=INFO msg="info line"`) || strings.Contains(out, "dbg line") {
				t.Errorf("want text at info and above:\n%s", out)
			}
		}},
		{name: "json debug flags", args: []string{"run", "--log-format", "json", "--log-level", "debug"}, check: func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 3 {
				t.Fatalf("want 3 JSON lines (debug, info, warn), got:\n%s", out)
			}
			for _, l := range lines {
				var rec map[string]any
				if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["component"] != "test" || rec["msg"] == nil {
					t.Errorf("not a JSON log record with component: %q (%v)", l, err)
				}
			}
		}},
		{name: "env", env: map[string]string{"DEPTRACE_LOG_FORMAT": "json", "DEPTRACE_LOG_LEVEL": "warn"}, args: []string{"run"}, check: func(t *testing.T, out string) {
			if strings.TrimSpace(out) == "" || strings.Contains(out, "info line") || !strings.HasPrefix(out, `{"time"`) {
				t.Errorf("want JSON, warn only:\n%s", out)
			}
		}},
		{name: "flag beats env", env: map[string]string{"DEPTRACE_LOG_LEVEL": "error"}, args: []string{"--log-level", "info", "run"}, check: func(t *testing.T, out string) {
			if !strings.Contains(out, "info line") {
				t.Errorf("the flag must win over the environment:\n%s", out)
			}
		}},
		{name: "bad format", args: []string{"run", "--log-format", "xml"}, wantErr: `invalid --log-format "xml": allowed text, json`},
		{name: "bad level", args: []string{"run", "--log-level", "verbose"}, wantErr: `invalid --log-level "verbose": allowed debug, info, warn, error`},
		{name: "bad env level", env: map[string]string{"DEPTRACE_LOG_LEVEL": "INFO "}, args: []string{"run"}, wantErr: `invalid --log-level "INFO ": allowed debug, info, warn, error (set from DEPTRACE_LOG_LEVEL)`},
		{name: "bad env int", env: map[string]string{"DEPTRACE_SIZE": "big"}, args: []string{"run"}, wantErr: `invalid DEPTRACE_SIZE="big" for --size: allowed a whole number`},
		{name: "bad flag int", args: []string{"run", "--size", "big"}, wantErr: `invalid --size "big": allowed a whole number`, notErr: "strconv"},
		{name: "flag out of its type's range", args: []string{"run", "--slots", "5000000000"}, wantErr: `invalid --slots "5000000000": allowed a whole number from 0 to 4294967295`},
		{name: "bad flag duration", args: []string{"run", "--every", "soon"}, wantErr: `invalid --every "soon": allowed a duration such as 500ms, 30s, 5m or 1h`},
		// A flag with a range of its own says it, not its type's.
		{name: "ranged value", args: []string{"run", "--edges", "-1"}, wantErr: `invalid --edges "-1": allowed 0 (no cap) or 1 to 1048576`},
		{name: "ranged value from env", env: map[string]string{"DEPTRACE_EDGES": "x"}, args: []string{"run"}, wantErr: `invalid DEPTRACE_EDGES="x" for --edges: allowed 0 (no cap) or 1 to 1048576`},
		{name: "annotated flag out of its type's range", args: []string{"run", "--map-size", "99999999999"}, wantErr: `invalid --map-size "99999999999": allowed 64 to 4194304`},
		{name: "annotated flag from env", env: map[string]string{"DEPTRACE_MAP_SIZE": "-1"}, args: []string{"run"}, wantErr: `invalid DEPTRACE_MAP_SIZE="-1" for --map-size: allowed 64 to 4194304`},
		{name: "unknown env", env: map[string]string{"DEPTRACE_SZIE": "5", "DEPTRACE_TEST_HALT": "x", "DEPTRACE_LOG_LEVEL": "warn"}, args: []string{"run"}, check: func(t *testing.T, out string) {
			if !strings.Contains(out, `msg="environment variable ignored: no flag of deptrace has that name" variable=DEPTRACE_SZIE`) || strings.Contains(out, "DEPTRACE_TEST_HALT") || strings.Contains(out, "DEPTRACE_LOG_LEVEL") {
				t.Errorf("want one warning, for DEPTRACE_SZIE only:\n%s", out)
			}
		}},
		{name: "a flag of another command is known", env: map[string]string{"DEPTRACE_STORE": "x.db"}, args: []string{"run"}, check: func(t *testing.T, out string) {
			if strings.Contains(out, "ignored") {
				t.Errorf("DEPTRACE_STORE is the other command's flag, yet:\n%s", out)
			}
		}},
		// A value the flag takes but the command refuses names its variable.
		{name: "bad env value", env: map[string]string{"DEPTRACE_SIZE": "0"}, args: []string{"run"}, wantErr: `invalid --size 0: allowed 1 or more (set from DEPTRACE_SIZE)`},
		{name: "bad flag value", args: []string{"run", "--size", "0"}, wantErr: `invalid --size 0: allowed 1 or more`, notErr: "DEPTRACE_SIZE"},
		{name: "a longer flag is another flag", env: map[string]string{"DEPTRACE_SIZE": "5"}, args: []string{"run", "--size-max", "1"}, wantErr: `invalid --size-max 1`, notErr: "DEPTRACE_SIZE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out bytes.Buffer
			var size int
			r := root(&out, &size)
			r.SetArgs(c.args)
			err := Execute(r)
			if c.wantErr != "" {
				if err == nil || !strings.HasPrefix(OneLine(err), c.wantErr) || (c.notErr != "" && strings.Contains(err.Error(), c.notErr)) {
					t.Fatalf("error %v, want %q without %q", err, c.wantErr, c.notErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, out.String())
		})
	}
}

func TestOneLine(t *testing.T) {
	if got := OneLine(errString("load: verifier\n  line 1\n\tline 2")); got != "load: verifier; line 1; line 2" {
		t.Errorf("OneLine = %q", got)
	}
	// pgx lists the addresses it tried below a line ending in ":".
	pgx := "connect to store postgres://nobody@127.0.0.1:1/x: failed to connect to `user=nobody database=x`:\n\t127.0.0.1:1 (127.0.0.1): dial error: connection refused\n"
	if got, want := OneLine(errString(pgx)), "connect to store postgres://nobody@127.0.0.1:1/x: failed to connect to `user=nobody database=x`: 127.0.0.1:1 (127.0.0.1): dial error: connection refused"; got != want {
		t.Errorf("OneLine = %q, want %q", got, want)
	}
}

// A command without positional arguments names what it got and where
// its flags are listed.
func TestNoArgs(t *testing.T) {
	r := &cobra.Command{Use: "deptrace"}
	Configure(r)
	r.AddCommand(&cobra.Command{Use: "trace", Args: NoArgs, RunE: func(*cobra.Command, []string) error { return nil }})
	r.SetArgs([]string{"trace", "extra-arg", "x y"})
	want := `trace takes no arguments, got "extra-arg" "x y": flags start with -- (deptrace trace --help lists them)`
	if err := Execute(r); err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	r.SetArgs([]string{"trace"})
	if err := Execute(r); err != nil {
		t.Errorf("without arguments: %v", err)
	}
}

// rangedInt is a flag value with a range of its own, as the agent's
// --max-edges-per-node (a Ranged whose Type is a plain "int").
type rangedInt struct{ n int }

func (r *rangedInt) String() string  { return fmt.Sprint(r.n) }
func (r *rangedInt) Type() string    { return "int" }
func (r *rangedInt) Allowed() string { return "0 (no cap) or 1 to 1048576" }
func (r *rangedInt) Set(s string) error {
	if _, err := fmt.Sscan(s, &r.n); err != nil || r.n < 0 || r.n > 1<<20 {
		return fmt.Errorf("allowed %s", r.Allowed())
	}
	return nil
}

type errString string

func (e errString) Error() string { return string(e) }

// SIGHUP stops a command cleanly, unless it was ignored at start (nohup):
// subscribing to it would undo that. (cmd/deptrace's
// TestHangupUnderNohupGoesOn runs both with real processes.)
func TestStopSignalsLeaveNohupAlone(t *testing.T) {
	if got := stopSignals(false); !slices.Equal(got, []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}) {
		t.Errorf("stopSignals(false) = %v, want interrupt, SIGTERM and SIGHUP", got)
	}
	if got := stopSignals(true); !slices.Equal(got, []os.Signal{os.Interrupt, syscall.SIGTERM}) {
		t.Errorf("stopSignals(true) = %v with SIGHUP ignored, want it left out", got)
	}
}

// Durations in ranges and errors read as people type them, and exactly:
// the text parses back to the same duration.
func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                     "0s",
		time.Hour:                             "1h",
		30 * time.Minute:                      "30m",
		90 * time.Second:                      "1m30s",
		100 * time.Millisecond:                "100ms",
		24 * time.Hour:                        "24h",
		time.Second:                           "1s",
		time.Nanosecond:                       "1ns",
		1500 * time.Microsecond:               "1.5ms",
		1500 * time.Millisecond:               "1.5s",
		90 * time.Minute:                      "1h30m",
		time.Hour + 30*time.Second:            "1h30s",
		time.Hour + time.Nanosecond:           "1h1ns",
		time.Minute + 500*time.Millisecond:    "1m500ms",
		400 * 24 * time.Hour:                  "9600h",
		-90 * time.Minute:                     "-1h30m",
		-100 * time.Millisecond:               "-100ms",
		time.Duration(math.MaxInt64):          "2562047h47m16.854775807s",
		time.Duration(math.MinInt64):          "-2562047h47m16.854775808s",
		2*time.Hour + 3*time.Minute + 1500000: "2h3m1.5ms",
	} {
		got := FormatDuration(d)
		if got != want {
			t.Errorf("FormatDuration(%s) = %q, want %q", d, got, want)
		}
		if back, err := time.ParseDuration(got); err != nil || back != d {
			t.Errorf("%q reads back as %s, %v; want %s", got, back, err, d)
		}
	}
}
