// Package cli holds what every deptrace binary's command line shares: the
// DEPTRACE_* environment variables, the logging flags, and one-line errors.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

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
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := ApplyEnv(cmd); err != nil {
			return err
		}
		log, err := NewLogger(cmd.ErrOrStderr(), format, level)
		if err != nil {
			return err
		}
		slog.SetDefault(log)
		return nil
	}
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
			errs = append(errs, fmt.Errorf("invalid %s=%q for --%s: %w", env, v, f.Name, err))
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
func OneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
