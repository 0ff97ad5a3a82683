// Command deptrace discovers the dependencies between network services
// from inside the Linux kernel. See README.md.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "deptrace: "+oneLine(err))
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "deptrace",
		Short: "Discover network service dependencies with eBPF",
		Long: `deptrace counts every TCP connection and every TCP/UDP send and receive into one
kernel map entry per dependency (local address, remote address, server port,
direction, protocol, network namespace) and reports those bundled flows.

Every flag can also be set from the environment: --flow-map-size is
DEPTRACE_FLOW_MAP_SIZE, and so on.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
			return applyEnv(cmd)
		},
	}
	root.AddCommand(newTraceCmd(), newDoctorCmd(), newAgentCmd(), newLookCmd(), newGraphCmd(), newDiffCmd(), newServeCmd(), newCleanupCmd(), newBenchCmd())
	return root
}

// applyEnv sets every flag not given on the command line from its
// DEPTRACE_* environment variable.
func applyEnv(cmd *cobra.Command) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" {
			return
		}
		env := "DEPTRACE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		if err := cmd.Flags().Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("invalid %s=%q for --%s: %w", env, v, f.Name, err))
		}
	})
	return errors.Join(errs...)
}

// oneLine keeps an error to a single line; verifier logs are printed in
// full by doctor, not here.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
