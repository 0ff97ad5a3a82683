package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/dnswatch"
	"github.com/deptrace/deptrace/internal/hooks"
	"github.com/deptrace/deptrace/internal/identity"
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
		idf      identityFlags
		df       dnsFlags
	)
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Print bundled TCP/UDP flows every interval",
		Long: `trace loads the flow bundler and prints, every interval, one line per
dependency seen in that interval: local end, direction arrow (--> the local end
is the client, <-- it is the server), peer, process, connections, failed
connection attempts and bytes each way. Local ends in a systemd unit, a
container or a Kubernetes pod are named by it (from the cgroup and the
runtime's own API; --no-identity turns this off). Outbound flows to an address a
DNS answer gave carry the name asked for, and each client's lookups are counted
per resolver in a DNS section (--no-dns turns both off). Ctrl-C or SIGTERM prints
the last partial interval before exiting.`,
		Example: `  deptrace trace
  deptrace trace --output jsonl --duration 10s
  deptrace trace --proto tcp --port 5432,6379 --netns self`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := tf.config()
			if err != nil {
				return err
			}
			if interval < tracer.MinInterval || interval > tracer.MaxInterval {
				return fmt.Errorf("invalid --interval %s: allowed %s", cli.FormatDuration(interval), traceIntervals)
			}
			if duration < 0 {
				return fmt.Errorf("invalid --duration %s: allowed %s", cli.FormatDuration(duration), traceDurations)
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
			w, err := output.New(format, os.Stdout, netns.DisplayNames, interval)
			if err != nil {
				return err
			}
			dw, err := output.NewDNS(format, os.Stdout, netns.DisplayNames, interval)
			if err != nil {
				return err
			}
			idCfg, err := idf.config()
			if err != nil {
				return err
			}
			dnsCfg, err := df.config(cfg.NetNS)
			if err != nil {
				return err
			}
			return runTrace(cmd.Context(), cfg, duration, filter, w, dw, idCfg, dnsCfg)
		},
	}
	tf.register(cmd)
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between two drains of the kernel map (100ms to 1h)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "stop after this long; 0 runs until interrupted")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: "+strings.Join(output.Formats, ", "))
	cmd.Flags().StringVar(&proto, "proto", "all", "protocols to show: tcp, udp, unix, all (comma list)")
	cmd.Flags().StringSliceVar(&ports, "port", nil, "server ports to show (comma list); default all")
	idf.register(cmd)
	df.register(cmd)
	cli.SetAllowed(cmd.Flags(), "interval", traceIntervals)
	cli.SetAllowed(cmd.Flags(), "duration", traceDurations)
	return cmd
}

// What trace's --interval and --duration take.
var (
	traceIntervals = cli.FormatDuration(tracer.MinInterval) + " to " + cli.FormatDuration(tracer.MaxInterval)
	traceDurations = "0 (until interrupted) or more"
)

// dnsFlags turn the DNS watcher (names of remote ends, each client's
// lookups) on or off; trace and agent share them.
type dnsFlags struct {
	off     bool
	timeout time.Duration
}

func (f *dnsFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.off, "no-dns", false, "do not watch DNS: no names of remote ends (remote_name), no per-client DNS records")
	cmd.Flags().DurationVar(&f.timeout, "dns-timeout", dnswatch.DefaultTimeout, "a DNS query without an answer for this long counts as a timeout ("+dnsTimeouts+")")
	cli.SetAllowed(cmd.Flags(), "dns-timeout", dnsTimeouts)
}

// dnsTimeouts is what --dns-timeout takes: dnswatch's bounds.
var dnsTimeouts = cli.FormatDuration(dnswatch.MinTimeout) + " to " + cli.FormatDuration(dnswatch.MaxTimeout)

// config returns nil when DNS watching is off.
func (f *dnsFlags) config(netns uint32) (*dnswatch.Config, error) {
	if f.off {
		return nil, nil
	}
	// Checked here, not only by Validate, to write the durations as
	// the flag takes them.
	if f.timeout < dnswatch.MinTimeout || f.timeout > dnswatch.MaxTimeout {
		return nil, fmt.Errorf("invalid --dns-timeout %s: allowed %s", cli.FormatDuration(f.timeout), dnsTimeouts)
	}
	cfg := dnswatch.DefaultConfig()
	cfg.NetNS, cfg.Timeout = netns, f.timeout
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// dnsLosses remembers what the DNS watcher had lost or could not read
// when last asked, to warn once per interval that adds to either.
type dnsLosses struct{ lost, unreadable uint64 }

func (d *dnsLosses) warn(st dnswatch.Stats, log *slog.Logger) {
	if st.Lost > d.lost {
		log.Warn("DNS records lost: the ring buffer was full, or a preempted record was in the way", "lost", st.Lost-d.lost)
		d.lost = st.Lost
	}
	if st.Unreadable > d.unreadable {
		// io_uring, sendfile() or splice() resolvers: their lookups
		// count as unparsed, without names.
		log.Warn("DNS calls whose message could not be read, counted unparsed", "unreadable", st.Unreadable-d.unreadable)
		d.unreadable = st.Unreadable
	}
}

// startDNS starts the DNS watcher; on failure tracing goes on without it
// (a warning says why).
func startDNS(cfg *dnswatch.Config, t *tracer.Tracer, log *slog.Logger) *dnswatch.Watcher {
	if cfg == nil {
		return nil
	}
	c := *cfg
	c.Calls = t // its send and receive programs hand DNS calls over (6.3 and later); its sendmsg programs note resolvers
	w, err := dnswatch.New(c)
	if err != nil {
		log.Warn("DNS names and per-client DNS records are off", "err", err)
		return nil
	}
	v := w.Variant()
	if err := w.HandOffRefused(); err != nil {
		log.Warn("DNS watcher: its per-call programs did not load or the kernel refused them in the tracer's calls; watching every packet instead, which costs more", "err", err)
	}
	log.Info("watching DNS", "variant", v.Name, "in_tracer_calls", w.HandedOff())
	if v.Lost != "" {
		log.Warn("DNS watcher: this kernel's programs miss some lookups", "variant", v.Name, "lost", v.Lost)
	}
	return w
}

// identityFlags turn naming of local ends (systemd unit, container,
// Kubernetes pod and workload) on or off and say where the runtimes listen.
type identityFlags struct {
	off                              bool
	docker, podman, containerd, crio string
	retain                           time.Duration
}

func (f *identityFlags) register(cmd *cobra.Command) {
	def := identity.DefaultConfig()
	cmd.Flags().BoolVar(&f.off, "no-identity", false, "do not name local ends by systemd unit, container and Kubernetes pod (no cgroup watch, no runtime API calls)")
	cmd.Flags().StringVar(&f.docker, "docker-socket", def.DockerSocket, "Docker Engine API socket for container names, images and Compose labels; empty turns Docker lookups off")
	cmd.Flags().StringVar(&f.podman, "podman-socket", def.PodmanSocket, "podman's Docker-compatible API socket; empty turns podman lookups off")
	cmd.Flags().StringVar(&f.containerd, "containerd-socket", def.ContainerdSocket, "containerd's socket for CRI lookups (Kubernetes pods); empty turns them off")
	cmd.Flags().StringVar(&f.crio, "crio-socket", def.CRIOSocket, "CRI-O's socket for CRI lookups (Kubernetes pods); empty turns them off")
	cmd.Flags().DurationVar(&f.retain, "identity-retain", def.Retain, "how long exited containers and removed cgroups stay named (1s to 24h)")
	cli.SetAllowed(cmd.Flags(), "identity-retain", identityRetains)
}

// identityRetains is what --identity-retain takes.
const identityRetains = "1s to 24h"

// config returns nil when identity is off.
func (f *identityFlags) config() (*identity.Config, error) {
	if f.off {
		return nil, nil
	}
	if f.retain < time.Second || f.retain > 24*time.Hour {
		return nil, fmt.Errorf("invalid --identity-retain %s: allowed %s", cli.FormatDuration(f.retain), identityRetains)
	}
	cfg := identity.DefaultConfig()
	cfg.DockerSocket, cfg.PodmanSocket, cfg.ContainerdSocket, cfg.CRIOSocket = f.docker, f.podman, f.containerd, f.crio
	cfg.Retain = f.retain
	return &cfg, nil
}

func runTrace(parent context.Context, cfg tracer.Config, duration time.Duration, filter output.Filter, w output.Writer, dw output.DNSWriter, idCfg *identity.Config, dnsCfg *dnswatch.Config) error {
	log := slog.With("component", "trace")
	// Signals first: a SIGTERM at any time after start must end with the
	// last interval printed, never kill the process mid-load.
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, cli.StopSignals()...)
	defer stop()
	// The resolver starts first: it learns cgroups and containers as they
	// appear, so that one gone by the first drain is still named.
	var names *identity.Resolver
	if idCfg != nil {
		var err error
		if names, err = identity.New(*idCfg); err != nil {
			log.Warn("local ends will not be named by unit or container", "err", err)
		} else {
			defer func() { _ = names.Close() }() // stops watching; nothing to report at exit
		}
	}
	t, err := tracer.New(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = t.Close() }() // unloads the kernel side at exit; the trace is written
	dns := startDNS(dnsCfg, t, log)
	if dns != nil {
		defer func() { _ = dns.Close() }() // detaches; nothing to report at exit
	}
	var dnsLost dnsLosses
	hooks.LogUncovered(log, t.Hooks())
	hooks.LogMissingCapabilities(log, false)
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
	// Nothing in emit (dns.Apply, the filter, Annotate, the writers)
	// keeps a flow past it: the next interval reuses them.
	err = t.RunWith(ctx, tracer.RunOptions{ReuseFlows: true}, func(iv tracer.Interval) error {
		if dns != nil {
			dns.Apply(&iv)
			dnsLost.warn(dns.Stats(), log)
		}
		shown := filter.Apply(iv.Flows)
		flows += uint64(len(shown))
		if names != nil {
			names.Annotate(shown)
			for i := range iv.DNS {
				iv.DNS[i].Identity = names.Resolve(iv.DNS[i].CgroupID)
			}
		}
		if l := iv.Lost; l.Total() > 0 {
			lost += l.Total()
			log.Warn("events lost this interval", lossAttrs(l, cfg)...)
		}
		if err := w.Write(shown, filter.ApplyListeners(iv.Listeners)); err != nil {
			return err
		}
		if filter.DNSShown() {
			return dw.WriteDNS(iv.DNS)
		}
		return nil
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
