package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/tracer"
)

func newCleanupCmd() *cobra.Command {
	var pinPath string
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Detach and remove a kernel side left pinned by a killed agent (root)",
		Long: `cleanup removes the kernel side a deptrace agent left pinned on bpffs because it
was killed or stopped with --keep-tracing: its programs stop counting and its
maps are freed. It refuses while an agent owns the pin path.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			found, err := tracer.Cleanup(pinPath)
			if err != nil {
				return fmt.Errorf("cleanup %s: %w", pinPath, err)
			}
			if !found {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing pinned at %s\n", pinPath)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed the kernel side pinned at %s\n", pinPath)
			return nil
		},
	}
	cmd.Flags().StringVar(&pinPath, "pin-path", tracer.DefaultPinPath, "bpffs directory of the pinned kernel side")
	return cmd
}
