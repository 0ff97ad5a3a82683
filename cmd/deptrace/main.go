// Command deptrace discovers the dependencies between network services
// from inside the Linux kernel. See README.md.
package main

import (
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/cli"
)

// version is set by make build (-X main.version=...); `go install
// module@version` builds report the module version instead.
var version = "dev"

func main() { cli.Main(newRootCmd()) }

func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:     "deptrace",
		Version: buildVersion(),
		Short:   "Discover network service dependencies with eBPF",
		Long: `deptrace counts every TCP connection and every TCP/UDP send and receive into one
kernel map entry per dependency (local address, remote address, server port,
direction, protocol, network namespace) and reports those bundled flows.

Every flag can also be set from the environment: --flow-map-size is
DEPTRACE_FLOW_MAP_SIZE, --log-format is DEPTRACE_LOG_FORMAT, and so on.`,
	}
	cli.Configure(root)
	root.AddCommand(newTraceCmd(), newDoctorCmd(), newAgentCmd(), newLookCmd(), newGraphCmd(), newDiffCmd(), newServeCmd(), newCleanupCmd())
	cli.ShowDurations(root)
	return root
}
