// Package cli holds what every deptrace binary's command line shares: the
// DEPTRACE_* environment variables, the logging flags, and one-line errors.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Allowed values of --log-format and --log-level.
var (
	LogFormats = []string{"text", "json"}
	LogLevels  = []string{"debug", "info", "warn", "error"}
)

// Configure adds the persistent --log-format and --log-level flags to root
// and, before any subcommand runs, sets every flag not given on the
// command line from its DEPTRACE_* environment variable and installs the
// slog default logger (writing to the command's stderr).
func Configure(root *cobra.Command) {
	var format, level string
	root.PersistentFlags().StringVar(&format, "log-format", "text", "log format: "+strings.Join(LogFormats, ", "))
	root.PersistentFlags().StringVar(&level, "log-level", "info", "least severe log level shown: "+strings.Join(LogLevels, ", "))
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		var bad *pflag.InvalidValueError
		if errors.As(err, &bad) {
			if allowed := AllowedText(bad.GetFlag()); allowed != "" {
				return fmt.Errorf("invalid --%s %q: allowed %s", bad.GetFlag().Name, bad.GetValue(), allowed)
			}
		}
		return err
	})
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := ApplyEnv(cmd); err != nil {
			return err
		}
		log, err := NewLogger(cmd.ErrOrStderr(), format, level)
		if err != nil {
			return err
		}
		slog.SetDefault(log)
		for _, env := range unknownEnv(cmd.Root(), os.Environ()) {
			log.Warn("environment variable ignored: no flag of "+cmd.Root().Name()+" has that name", "variable", env)
		}
		return nil
	}
}

// ShowDurations writes the defaults of the duration flags of root and
// of every command under it as FormatDuration does, so that --help says
// "(default 10m)", as people type it, not Go's "10m0s". Call it once the
// commands are added.
func ShowDurations(root *cobra.Command) {
	for _, fs := range []*pflag.FlagSet{root.Flags(), root.PersistentFlags()} {
		fs.VisitAll(func(f *pflag.Flag) {
			if d, err := time.ParseDuration(f.DefValue); err == nil && f.Value.Type() == "duration" {
				f.DefValue = FormatDuration(d)
			}
		})
	}
	for _, c := range root.Commands() {
		ShowDurations(c)
	}
}

// Ranged is a flag value that says what it takes (its Set refuses the
// rest): "0 (no cap) or 1 to 1048576". The error of a value it refuses
// reads "invalid --flag "VALUE": allowed " and that.
type Ranged interface {
	Allowed() string
}

// allowedAnnotation holds what SetAllowed says a flag takes.
const allowedAnnotation = "deptrace_allowed"

// SetAllowed records what the flag name of fs takes, such as "64 to
// 4194304" or "1s to 1h" (durations written by FormatDuration), where its
// type allows more (the command checks the range once the flags are
// parsed): a value that does not even parse as the type ("99999999999"
// for a uint32, "soon" for a duration) is refused with that range, not
// with the type's. The command's own range error should say the same.
func SetAllowed(fs *pflag.FlagSet, name, allowed string) {
	if err := fs.SetAnnotation(name, allowedAnnotation, []string{allowed}); err != nil {
		panic(err) // no such flag: a programming error
	}
}

// FormatDuration writes d as people type a duration, for ranges,
// defaults and values in errors: 1h, 30m, 1m30s, 100ms, 24h, where
// time.Duration.String writes 1h0m0s, 30m0s and 24h0m0s. Hours and
// minutes are whole and left out when zero; what is left below a minute
// is written as Duration.String writes it (1.5s, 100ms, 1ns), so nothing
// is rounded away and time.ParseDuration reads the text back as d. Zero
// is 0s. No days: a duration flag does not take them.
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	var b []byte
	u := uint64(d)
	if d < 0 {
		b = append(b, '-')
		u = -u // in uint64, so that the most negative Duration has its size
	}
	for _, unit := range []struct {
		size uint64
		name byte
	}{{uint64(time.Hour), 'h'}, {uint64(time.Minute), 'm'}} {
		if n := u / unit.size; n > 0 {
			b = strconv.AppendUint(b, n, 10)
			b = append(b, unit.name)
			u %= unit.size
		}
	}
	if u > 0 {
		b = append(b, time.Duration(u).String()...)
	}
	return string(b)
}

// AllowedText says what flag f takes, for the error of a value it
// refuses: its own range where it has one (Ranged, SetAllowed), else
// what its type takes ("" for types whose errors say it).
func AllowedText(f *pflag.Flag) string {
	if r, ok := f.Value.(Ranged); ok {
		return r.Allowed()
	}
	if a := f.Annotations[allowedAnnotation]; len(a) == 1 {
		return a[0]
	}
	return allowedValues(f)
}

// allowedValues says what a flag of a plain type takes, for the error of
// a value it cannot parse ("" for other types, whose errors say it).
func allowedValues(f *pflag.Flag) string {
	switch f.Value.Type() {
	case "int", "int64":
		return "a whole number"
	case "int8":
		return "a whole number from -128 to 127"
	case "int16":
		return "a whole number from -32768 to 32767"
	case "int32":
		return "a whole number from -2147483648 to 2147483647"
	case "uint", "uint64":
		return "a whole number, 0 or more"
	case "uint8":
		return "a whole number from 0 to 255"
	case "uint16":
		return "a whole number from 0 to 65535"
	case "uint32":
		return "a whole number from 0 to 4294967295"
	case "float32", "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "duration":
		return "a duration such as 500ms, 30s, 5m or 1h"
	}
	return ""
}

// nonFlagEnv are DEPTRACE_* variables that are no flag's but are read all
// the same: by the test suite and the benchmark (DEPTRACE_TEST_* and
// DEPTRACE_BENCH_* are too), by packaging.
var nonFlagEnv = []string{"DEPTRACE_IDENTITY_TEST_DIAL", "DEPTRACE_CHROMIUM", "DEPTRACE_SCREENSHOTS", "DEPTRACE_UPDATE_SCREENSHOTS", "DEPTRACE_ARCH", "DEPTRACE_BINARY"}

// unknownEnv lists the DEPTRACE_* variables of environ that no flag of any
// command under root has: a typo in an environment file
// (DEPTRACE_STORE_MAX_SZIE) would otherwise be ignored in silence. Any
// command's flags count, as agent and serve share /etc/default/deptrace.
func unknownEnv(root *cobra.Command, environ []string) []string {
	known := map[string]bool{}
	var visit func(c *cobra.Command)
	visit = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { known[EnvName(f.Name)] = true })
		}
		for _, sub := range c.Commands() {
			visit(sub)
		}
	}
	visit(root)
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "DEPTRACE_") || known[name] || slices.Contains(nonFlagEnv, name) ||
			strings.HasPrefix(name, "DEPTRACE_TEST_") || strings.HasPrefix(name, "DEPTRACE_BENCH_") {
			continue
		}
		unknown = append(unknown, name)
	}
	slices.Sort(unknown)
	return unknown
}

// NewLogger builds a logger for --log-format and --log-level values; a bad
// value is an error naming the flag and the allowed values.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if !slices.Contains(LogLevels, level) || lv.UnmarshalText([]byte(level)) != nil {
		return nil, fmt.Errorf("invalid --log-level %q: allowed %s", level, strings.Join(LogLevels, ", "))
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("invalid --log-format %q: allowed %s", format, strings.Join(LogFormats, ", "))
}

// EnvName is the environment variable of a flag: --flow-map-size is
// DEPTRACE_FLOW_MAP_SIZE.
func EnvName(flag string) string {
	return "DEPTRACE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// fromEnv annotates a flag ApplyEnv set; its value is the variable's name.
const fromEnv = "deptrace_from_env"

// ApplyEnv sets every flag of cmd (its own and inherited) not given on the
// command line from its DEPTRACE_* environment variable.
func ApplyEnv(cmd *cobra.Command) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" {
			return
		}
		env := EnvName(f.Name)
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		if err := cmd.Flags().Set(f.Name, v); err != nil {
			if allowed := AllowedText(f); allowed != "" {
				errs = append(errs, fmt.Errorf("invalid %s=%q for --%s: allowed %s", env, v, f.Name, allowed))
			} else {
				errs = append(errs, fmt.Errorf("invalid %s=%q for --%s: %w", env, v, f.Name, err))
			}
			return
		}
		_ = cmd.Flags().SetAnnotation(f.Name, fromEnv, []string{env}) // the flag exists: VisitAll found it
	})
	return errors.Join(errs...)
}

// Execute runs root. An error about a flag set from the environment says
// so: "invalid --proto "x": ... (set from DEPTRACE_PROTO)", as the user
// typed no --proto.
func Execute(root *cobra.Command) error {
	cmd, err := root.ExecuteC()
	if err == nil || cmd == nil {
		return err
	}
	var envs []string
	msg := err.Error()
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		env := f.Annotations[fromEnv]
		if len(env) == 1 && mentionsFlag(msg, f.Name) && !strings.Contains(msg, env[0]) {
			envs = append(envs, env[0])
		}
	})
	if len(envs) == 0 {
		return err
	}
	return fmt.Errorf("%w (set from %s)", err, strings.Join(envs, ", "))
}

// mentionsFlag reports whether msg names --name itself, not a longer flag
// it begins (--port in --port-map-size).
func mentionsFlag(msg, name string) bool {
	flag := "--" + name
	for i := strings.Index(msg, flag); i >= 0; {
		end := i + len(flag)
		if end == len(msg) || !isFlagChar(msg[end]) {
			return true
		}
		next := strings.Index(msg[end:], flag)
		if next < 0 {
			return false
		}
		i = end + next
	}
	return false
}

func isFlagChar(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' }

// NoArgs is cobra.NoArgs for commands that take no positional arguments,
// with an error that says so: cobra's "unknown command" reads as a
// mistyped subcommand, where most often a flag lost its dashes.
func NoArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	got := make([]string, len(args))
	for i, a := range args {
		got[i] = fmt.Sprintf("%q", a)
	}
	// The command's own name: the program's is the line's prefix (Main).
	return fmt.Errorf("%s takes no arguments, got %s: flags start with -- (%s --help lists them)", cmd.Name(), strings.Join(got, " "), cmd.CommandPath())
}

// StopSignals are the signals that stop a deptrace command cleanly (the
// last interval printed or stored, the kernel side detached): Ctrl-C,
// SIGTERM, and SIGHUP, which a closed terminal or ssh session sends,
// unless it was ignored when the process started (nohup): subscribing
// to it would undo that.
func StopSignals() []os.Signal { return stopSignals(signal.Ignored(syscall.SIGHUP)) }

func stopSignals(hangupIgnored bool) []os.Signal {
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !hangupIgnored {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}

// Main runs root and exits: 0 on success, 1 with "name: error" on one line
// of stderr otherwise.
func Main(root *cobra.Command) {
	if err := Execute(root); err != nil {
		fmt.Fprintln(os.Stderr, root.Name()+": "+OneLine(err))
		os.Exit(1)
	}
}

// OneLine keeps an error to a single line; verifier logs are printed in
// full by doctor, not here.
func OneLine(err error) string { return OneLineText(err.Error()) }

// OneLineText joins the lines of s with "; ", or with a space after a
// line ending in ":" (pgx lists each address it tried below "failed to
// connect to ...:"), so that grep and journal readers get all of it.
func OneLineText(s string) string {
	out := ""
	for _, line := range strings.Split(s, "\n") {
		switch line = strings.Join(strings.Fields(line), " "); {
		case line == "":
		case out == "":
			out = line
		case strings.HasSuffix(out, ":"):
			out += " " + line
		default:
			out += "; " + line
		}
	}
	return out
}
