package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/internal/output"
	"github.com/deptrace/deptrace/tracer"
)

func newTraceCmd() *cobra.Command {
	var (
		tf       tracerFlags
		interval time.Duration
		duration time.Duration
		format   string
		proto    string
		ports    []string
	)
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Print bundled TCP/UDP flows every interval",
		Long: `trace loads the flow bundler and prints, every interval, one line per
dependency seen in that interval: local end, direction arrow (--> the local end
is the client, <-- it is the server), peer, process, connections, failed
connection attempts and bytes each way. Ctrl-C or SIGTERM prints the last
partial interval before exiting.`,
		Example: `  deptrace trace
  deptrace trace --output jsonl --duration 10s
  deptrace trace --proto tcp --port 5432,6379 --netns self`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := tf.config()
			if err != nil {
				return err
			}
			if interval < tracer.MinInterval || interval > tracer.MaxInterval {
				return fmt.Errorf("invalid --interval %s: allowed %s to %s", interval, tracer.MinInterval, tracer.MaxInterval)
			}
			if duration < 0 {
				return fmt.Errorf("invalid --duration %s: allowed 0 (until interrupted) or more", duration)
			}
			cfg.Interval = interval
			protos, err := output.ParseProtos(proto)
			if err != nil {
				return err
			}
			portList, err := output.ParsePorts(ports)
			if err != nil {
				return err
			}
			filter := output.Filter{Protos: protos, Ports: portList}
			w, err := output.New(format, os.Stdout, netns.Names())
			if err != nil {
				return err
			}
			return runTrace(cmd.Context(), cfg, duration, filter, w)
		},
	}
	tf.register(cmd)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between two drains of the kernel map (100ms to 1h)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop after this long; 0 runs until interrupted")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: "+strings.Join(output.Formats, ", "))
	cmd.Flags().StringVar(&proto, "proto", "all", "protocols to show: tcp, udp, unix, all (comma list)")
	cmd.Flags().StringSliceVar(&ports, "port", nil, "server ports to show (comma list); default all")
	return cmd
}

func runTrace(parent context.Context, cfg tracer.Config, duration time.Duration, filter output.Filter, w output.Writer) error {
	log := slog.With("component", "trace")
	// Signals first: a SIGTERM at any time after start must end with the
	// last interval printed, never kill the process mid-load.
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()
	t, err := tracer.New(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	tracer.LogUncovered(log, t.Hooks())
	if nsCount, ports, err := t.Seeded(); err != nil {
		log.Warn("seeding listening ports failed; older connections may show the wrong direction", "err", err)
	} else {
		log.Info("tracing", "netns", netnsLabel(cfg.NetNS), "interval", cfg.Interval, "namespaces_seeded", nsCount, "listening_ports", ports)
	}

	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}

	var flows, lost uint64
	err = t.Run(ctx, func(iv tracer.Interval) error {
		shown := filter.Apply(iv.Flows)
		flows += uint64(len(shown))
		if l := iv.Lost; l.Total() > 0 {
			lost += l.Total()
			log.Warn("events lost this interval", lossAttrs(l, cfg)...)
		}
		return w.Write(shown, filter.ApplyListeners(iv.Listeners))
	})
	log.Info("stopped", "flows", flows, "events_lost", lost)
	return err
}

func lossAttrs(l tracer.Losses, cfg tracer.Config) []any {
	attrs := []any{"total", l.Total()}
	if l.FlowMapFull > 0 {
		attrs = append(attrs, "flow_map_full", l.FlowMapFull, "hint", fmt.Sprintf("raise --flow-map-size (now %d) or shorten --interval", cfg.FlowMapSize))
	}
	if l.PortMapFull > 0 {
		attrs = append(attrs, "port_map_full", l.PortMapFull, "hint", fmt.Sprintf("raise --port-map-size (now %d)", cfg.PortMapSize))
	}
	if l.UDPPeerUnknown > 0 {
		attrs = append(attrs, "udp_peer_unknown", l.UDPPeerUnknown)
	}
	if l.FlowAllocFailed > 0 {
		attrs = append(attrs, "flow_alloc_failed", l.FlowAllocFailed)
	}
	if l.SockStorageFailed > 0 {
		attrs = append(attrs, "sock_storage_failed", l.SockStorageFailed)
	}
	if l.RecursionMisses > 0 {
		attrs = append(attrs, "recursion_misses", l.RecursionMisses)
	}
	return attrs
}

func netnsLabel(ino uint32) string {
	if ino == 0 {
		return "all"
	}
	return fmt.Sprint(ino)
}
