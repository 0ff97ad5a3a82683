package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/tracer"
)

// tracerFlags are the flags every command that loads the tracer shares.
type tracerFlags struct {
	netns       string
	flowMapSize uint32
	portMapSize uint32
	syscalls    bool
}

func (f *tracerFlags) register(cmd *cobra.Command) {
	def := tracer.DefaultConfig()
	cmd.Flags().StringVar(&f.netns, "netns", "all", "network namespace to trace: all, self, an inode number, an ip-netns name or an nsfs path")
	cmd.Flags().Uint32Var(&f.flowMapSize, "flow-map-size", def.FlowMapSize, fmt.Sprintf("most distinct bundled flows per interval (%d to %d)", tracer.MinMapSize, tracer.MaxFlowMapSize))
	cmd.Flags().Uint32Var(&f.portMapSize, "port-map-size", def.PortMapSize, fmt.Sprintf("most listening ports tracked (%d to %d)", tracer.MinMapSize, tracer.MaxPortMapSize))
	cli.SetAllowed(cmd.Flags(), "flow-map-size", flowMapSizes)
	cli.SetAllowed(cmd.Flags(), "port-map-size", portMapSizes)
	cmd.Flags().BoolVar(&f.syscalls, "syscall-tracepoints", false, "on kernels without fexit, see failed unix connects and TCP connects rejected before any SYN through the connect system call's exit tracepoint (every system call of every process then takes the kernel's slower exit path)")
}

// The map sizes' ranges, in their errors whether the value parses as a
// uint32 or not.
var (
	flowMapSizes = fmt.Sprintf("%d to %d", tracer.MinMapSize, tracer.MaxFlowMapSize)
	portMapSizes = fmt.Sprintf("%d to %d", tracer.MinMapSize, tracer.MaxPortMapSize)
)

// config validates the flags, naming the flag and its allowed range.
func (f *tracerFlags) config() (tracer.Config, error) {
	cfg := tracer.DefaultConfig()
	if f.flowMapSize < tracer.MinMapSize || f.flowMapSize > tracer.MaxFlowMapSize {
		return cfg, fmt.Errorf("invalid --flow-map-size %d: allowed %s", f.flowMapSize, flowMapSizes)
	}
	if f.portMapSize < tracer.MinMapSize || f.portMapSize > tracer.MaxPortMapSize {
		return cfg, fmt.Errorf("invalid --port-map-size %d: allowed %s", f.portMapSize, portMapSizes)
	}
	ns, err := netns.Resolve(f.netns)
	if err != nil {
		return cfg, err
	}
	cfg.NetNS, cfg.FlowMapSize, cfg.PortMapSize = ns, f.flowMapSize, f.portMapSize
	cfg.SyscallTracepoints = f.syscalls
	return cfg, nil
}
