package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/agent"
	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/dnswatch"
	deptracehooks "github.com/deptrace/deptrace/internal/hooks"
	"github.com/deptrace/deptrace/internal/identity"
	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// doctorSamples is what --sample takes.
const doctorSamples = "0 to 1m"

func newDoctorCmd() *cobra.Command {
	var (
		tf        tracerFlags
		sample    time.Duration
		storeSpec string
		spoolPath string
		idCfg     = identity.DefaultConfig()
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show which hooks work on this kernel, what is missing and why, and the loss counters",
		Long: `doctor checks the kernel and the process's capabilities, loads the flow bundler,
lists every hook as active or inactive (with the reason and what is lost without
it), says whether the DNS watcher loads (which variant, what it loses), seeds the
listening-port table, then traces for --sample and reports the
loss counters. Its identity lines say which cgroup layout names local ends and
whether each container runtime's socket is there and answers (--docker-socket
and the others, as trace and agent take them). It exits with status 1 when
deptrace cannot run here.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := tf.config()
			if err != nil {
				return err
			}
			if sample < 0 || sample > time.Minute {
				return fmt.Errorf("invalid --sample %s: allowed %s", cli.FormatDuration(sample), doctorSamples)
			}
			return runDoctor(cmd.Context(), os.Stdout, cfg, sample, storeSpec, spoolPath, idCfg)
		},
	}
	tf.register(cmd)
	// The sockets as trace and agent take them (and their DEPTRACE_*
	// variables), so that doctor checks the ones they will ask.
	cmd.Flags().StringVar(&idCfg.DockerSocket, "docker-socket", idCfg.DockerSocket, "Docker Engine API socket to check; empty skips it")
	cmd.Flags().StringVar(&idCfg.PodmanSocket, "podman-socket", idCfg.PodmanSocket, "podman's Docker-compatible API socket to check; empty skips it")
	cmd.Flags().StringVar(&idCfg.ContainerdSocket, "containerd-socket", idCfg.ContainerdSocket, "containerd's socket to check for CRI; empty skips it")
	cmd.Flags().StringVar(&idCfg.CRIOSocket, "crio-socket", idCfg.CRIOSocket, "CRI-O's socket to check for CRI; empty skips it")
	cmd.Flags().DurationVar(&sample, "sample", time.Second, "trace this long to read the loss counters (0 to 1m)")
	cli.SetAllowed(cmd.Flags(), "sample", doctorSamples)
	cmd.Flags().StringVar(&storeSpec, "store", store.DefaultPath, "the agent's store to check")
	cmd.Flags().StringVar(&spoolPath, "spool", agent.DefaultSpoolPath, "the agent's spool to check")
	return cmd
}

// doctorStore reports whether the agent's store answers and what waits in
// its spool.
func doctorStore(ctx context.Context, out io.Writer, spec, spoolPath string) {
	if !strings.Contains(spec, "://") {
		if _, err := os.Stat(spec); err != nil {
			fmt.Fprintf(out, "store         none at %s (deptrace agent creates it)\n", spec)
			spec = ""
		}
	}
	if spec != "" {
		st, err := store.Open(ctx, spec)
		if err != nil {
			fmt.Fprintf(out, "store         UNREACHABLE: %s\n", cli.OneLine(err))
		} else {
			v, _ := st.Version(ctx)
			fmt.Fprintf(out, "store         %s, schema version %d\n", st, v)
			_ = st.Close() // read-only here
		}
	}
	if size, batches, err := agent.SpoolStatus(spoolPath); err != nil {
		fmt.Fprintf(out, "spool         %s unreadable: %s\n", spoolPath, cli.OneLine(err))
	} else if batches > 0 {
		fmt.Fprintf(out, "spool         %d batches (%d bytes) waiting in %s: the store was unreachable\n", batches, size, spoolPath)
	} else {
		fmt.Fprintf(out, "spool         empty (%s)\n", spoolPath)
	}
}

// doctorIdentity says which cgroup layout names local ends here and, for
// each container runtime, whether its socket is there and answers a
// request (as the resolver reaches it: no connect to a path that is no
// socket), and what is lost where it does not.
func doctorIdentity(ctx context.Context, out io.Writer, cfg identity.Config) {
	l, err := identity.ReadLayout(cfg.CgroupRoot)
	if err != nil {
		fmt.Fprintf(out, "identity      cgroup v2 UNREADABLE: %s: no local end is named by unit or container\n", cli.OneLine(err))
	} else {
		fmt.Fprintf(out, "identity      %s\n", layoutText(l))
	}
	doctorSources(ctx, out, cfg, l.Containers)
}

// layoutText is the cgroup line of doctorIdentity.
func layoutText(l identity.Layout) string {
	kind := "unified"
	if l.Hybrid {
		kind = "hybrid: v1 controllers beside it, containers are here only if their runtime puts them in v2"
	}
	var cs []string
	rts := make([]string, 0, len(l.Containers))
	for rt := range l.Containers {
		rts = append(rts, rt)
	}
	sort.Strings(rts)
	for _, rt := range rts {
		cs = append(cs, fmt.Sprintf("%d %s (%s driver)", l.Containers[rt], rt, strings.Join(l.Drivers[rt], " and ")))
	}
	containers := "none"
	if len(cs) > 0 {
		containers = strings.Join(cs, ", ")
	}
	return fmt.Sprintf("cgroup v2 at %s (%s): %s, %s; containers: %s", l.Root, kind, plural(l.Cgroups, "cgroup"), plural(l.Units, "systemd unit"), containers)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// doctorSources prints one line per runtime source; running counts the
// containers of each runtime in the cgroup tree.
func doctorSources(ctx context.Context, out io.Writer, cfg identity.Config, running map[string]int) {
	srcs := []struct{ rt, flag, socket string }{
		{identity.RuntimeDocker, "docker-socket", cfg.DockerSocket},
		{identity.RuntimePodman, "podman-socket", cfg.PodmanSocket},
		{identity.RuntimeContainerd, "containerd-socket", cfg.ContainerdSocket},
		{identity.RuntimeCRIO, "crio-socket", cfg.CRIOSocket},
	}
	checks := make([]identity.Check, len(srcs))
	var wg sync.WaitGroup
	for i, s := range srcs {
		if s.socket != "" {
			wg.Go(func() { checks[i] = identity.CheckSource(ctx, s.rt, s.socket, cfg.Timeout) })
		}
	}
	wg.Wait()
	for i, s := range srcs {
		c, n := checks[i], running[s.rt]
		lost := "its containers would be named by id only"
		switch {
		case n == 1:
			lost = fmt.Sprintf("1 %s container runs here, named by id only", s.rt)
		case n > 1:
			lost = fmt.Sprintf("%d %s containers run here, named by id only", n, s.rt)
		}
		var text string
		switch {
		case s.socket == "":
			text = fmt.Sprintf("off (--%s \"\")", s.flag)
		case c.NoSocket && n > 0:
			text = fmt.Sprintf("%s: NO SOCKET, but %s (--%s says where it listens)", s.socket, lost, s.flag)
		case c.NoSocket:
			text = fmt.Sprintf("%s: no socket (%s does not run here, or listens elsewhere: --%s)", s.socket, s.rt, s.flag)
		case c.NoCRI && n > 0:
			text = fmt.Sprintf("%s: answers WITHOUT THE CRI API (its cri plugin is off), but %s", s.socket, lost)
		case c.NoCRI:
			text = fmt.Sprintf("%s: answers without the CRI API (its cri plugin is off, as in Docker's containerd): no Kubernetes container is named through it", s.socket)
		case c.Err != nil:
			text = fmt.Sprintf("%s: UNREACHABLE: %s; %s", s.socket, cli.OneLine(c.Err), lost)
		default:
			text = fmt.Sprintf("%s: answers (%s)", s.socket, c.Version)
		}
		fmt.Fprintf(out, "identity      %s %s\n", s.rt, text)
	}
}

func runDoctor(ctx context.Context, out io.Writer, cfg tracer.Config, sample time.Duration, storeSpec, spoolPath string, idCfg identity.Config) error {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	fmt.Fprintf(out, "kernel        %s %s\n", unix.ByteSliceToString(uts.Release[:]), unix.ByteSliceToString(uts.Machine[:]))
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		fmt.Fprintf(out, "btf           missing: %v\n", kernel.ErrNoBTF)
	} else {
		fmt.Fprintln(out, "btf           /sys/kernel/btf/vmlinux")
	}
	if err := kernel.CheckCapabilities(); err != nil {
		fmt.Fprintf(out, "capabilities  %s\n", cli.OneLine(err))
	} else {
		fmt.Fprintln(out, "capabilities  CAP_BPF CAP_PERFMON CAP_NET_ADMIN CAP_SYS_ADMIN")
	}
	for _, o := range kernel.MissingOptional() {
		fmt.Fprintf(out, "capabilities  without %s: %s\n", o.Name, o.Loses)
	}
	if root, err := kernel.CgroupV2Root(); err != nil {
		fmt.Fprintf(out, "cgroup v2     %s (UDP hooks unavailable)\n", cli.OneLine(err))
	} else {
		fmt.Fprintf(out, "cgroup v2     %s\n", root)
	}
	if v, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled"); err == nil {
		fmt.Fprintf(out, "bpf_stats     %s (program run time is measured only while 1)\n", strings.TrimSpace(string(v)))
	}
	doctorStore(ctx, out, storeSpec, spoolPath)
	doctorIdentity(ctx, out, idCfg)

	t, err := tracer.New(cfg)
	if err != nil {
		fmt.Fprintf(out, "\nbundler       cannot load: %s\n", cli.OneLine(err))
		var hookErr *tracer.RequiredHookError
		if errors.As(err, &hookErr) && hookErr.Hook.Log != "" {
			fmt.Fprintf(out, "verifier log:\n%s\n", hookErr.Hook.Log)
		}
		return err
	}
	defer func() { _ = t.Close() }() // doctor only loads and unloads

	fmt.Fprintln(out, "\nHOOKS")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tHOOK\tPROVIDES")
	var missing []tracer.Hook
	hooks := t.Hooks()
	for _, h := range hooks {
		status := "active"
		switch {
		case h.Standby:
			status = "standby"
		case h.Off:
			status = "off"
			missing = append(missing, h)
		case !h.Active && deptracehooks.Covered(h, hooks):
			status = "replaced" // a fallback below does its work
		case !h.Active:
			status = "MISSING"
			missing = append(missing, h)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", status, h.Hook, h.Provides)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, h := range hooks {
		switch {
		case len(h.Copies) > 0:
			fmt.Fprintf(out, "copies        %s: %s after %s recover runs the kernel skips for recursion\n", h.Hook, strings.Join(h.Copies, ", "), h.Program)
		case h.Active && h.CopiesMissing != "":
			fmt.Fprintf(out, "copies        %s: none (%s); runs the kernel skips for recursion are lost\n", h.Hook, h.CopiesMissing)
		}
	}
	if len(missing) > 0 {
		fmt.Fprintln(out, "\nMISSING FEATURES")
		for _, h := range missing {
			fmt.Fprintf(out, "%s: %s\n  why: %s\n", h.Hook, h.Provides, cli.OneLineText(h.Reason))
			if why := explainMissing(h, runtime.GOARCH); why != "" {
				fmt.Fprintf(out, "  because: %s\n", why)
			}
			if h.Log != "" {
				fmt.Fprintf(out, "  verifier log:\n%s\n", h.Log)
			}
		}
	}

	fmt.Fprintln(out)
	doctorDNS(out, dnswatch.Probe)
	doctorDNSWithTracer(out, t)

	nsCount, ports, seedErr := t.Seeded()
	fmt.Fprintln(out)
	if seedErr != nil {
		fmt.Fprintf(out, "seeding       failed: %s\n", cli.OneLine(seedErr))
	} else {
		fmt.Fprintf(out, "seeding       %d listening ports found in %d network namespaces\n", ports, nsCount)
	}
	if lp, err := t.ListeningPorts(); err == nil {
		fmt.Fprintf(out, "port table    %d TCP listening ports (of %d)\n", len(lp), cfg.PortMapSize)
	}

	if sample > 0 {
		select {
		case <-time.After(sample):
		case <-ctx.Done():
		}
	}
	iv, err := t.Collect()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "drain         %d bundled flows and %d listeners in a %s sample\n", len(iv.Flows), len(iv.Listeners), sample)

	st, err := t.Stats()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\nLOSS COUNTERS (since load)")
	fmt.Fprintf(out, "flow map full        %d\n", st.Lost.FlowMapFull)
	fmt.Fprintf(out, "flow alloc failed    %d\n", st.Lost.FlowAllocFailed)
	fmt.Fprintf(out, "port table full      %d\n", st.Lost.PortMapFull)
	fmt.Fprintf(out, "udp peer unknown     %d\n", st.Lost.UDPPeerUnknown)
	fmt.Fprintf(out, "sock storage failed  %d\n", st.Lost.SockStorageFailed)
	fmt.Fprintf(out, "recursion misses     %d (%d more recovered by copies)\n", st.Lost.RecursionMisses, st.RecursionRecovered)

	names := make([]string, 0, len(st.Programs))
	for n := range st.Programs {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(out, "\nPROGRAMS (run time counts only while bpf_stats is 1)")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROGRAM\tRUNS\tAVG NS\tMISSES")
	for _, n := range names {
		p := st.Programs[n]
		avg := "-"
		if p.RunCount > 0 && p.RunTime > 0 {
			avg = fmt.Sprint(p.RunTime.Nanoseconds() / int64(p.RunCount))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", n, p.RunCount, avg, p.RecursionMisses)
	}
	return tw.Flush()
}

// explainMissing says in words what a kernel's raw refusal of a hook means,
// where the cause is known: "" otherwise. An fexit that fails to attach
// with ENOTSUPP ("not supported") on arm64 is a kernel built without
// CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS (Debian 12's 6.1 arm64 kernels):
// no fentry/fexit program attaches there, whatever deptrace does.
func explainMissing(h tracer.Hook, goarch string) string {
	if strings.HasPrefix(h.Hook, "fexit/") && strings.Contains(h.Reason, "not supported") {
		if goarch == "arm64" {
			return "this arm64 kernel cannot attach fentry/fexit programs (built without CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS, as Debian 12's 6.1 arm64 kernels are); a newer kernel (6.3 or later has the tracepoints these fexits stand in for) or one built with it removes this"
		}
		return "this kernel cannot attach fentry/fexit programs (BPF trampolines unsupported in its build); a kernel of 6.3 or later has the tracepoints these fexits stand in for"
	}
	return ""
}

// doctorDNSWithTracer starts the DNS watcher as trace and agent do, with
// this tracer, and says where its programs ended up: in the tracer's
// calls, or per packet and why; and who notes resolvers. Only this shows
// whether the kernel takes the per-call programs in the tracer's arrays.
func doctorDNSWithTracer(out io.Writer, t *tracer.Tracer) {
	cfg := dnswatch.DefaultConfig()
	cfg.Calls = t
	w, err := dnswatch.New(cfg)
	if err != nil {
		fmt.Fprintf(out, "dns watcher   with the tracer: CANNOT START: %s\n", cli.OneLine(err))
		return
	}
	defer func() { _ = w.Close() }() // doctor only starts and stops it
	v := w.Variant()
	where := fmt.Sprintf("variant %s, in the tracer's send and receive calls", v.Name)
	switch {
	case w.HandedOff():
	case w.HandOffRefused() != nil:
		where = fmt.Sprintf("variant %s, per packet: the per-call programs did not load or the kernel refused them in the tracer's calls: %s", v.Name, cli.OneLine(w.HandOffRefused()))
	default:
		why := "the tracer has no send and receive tracepoints here"
		if _, _, dests, _ := t.DNSCallHooks(); dests == nil {
			why = "the tracer's sendmsg programs, which note resolvers for the hand-off, are not attached"
		}
		where = fmt.Sprintf("variant %s, per packet (%s)", v.Name, why)
	}
	notes := "the tracer's sendmsg programs"
	switch {
	case w.OwnNotes():
		notes = "the watcher's own sendmsg programs (the tracer's are not attached)"
	case v.NotesLost != "":
		notes = "none (" + v.NotesLost + ")"
	}
	fmt.Fprintf(out, "dns watcher   with the tracer (as trace runs it): %s; resolver notes: %s\n", where, notes)
}

// doctorDNS says whether the DNS watcher (names of remote ends, DNS
// health) loads here, which of its program variants, and what that
// variant does not see; probe loads the variants without attaching them.
func doctorDNS(out io.Writer, probe func() ([]dnswatch.VariantResult, error)) {
	tried, err := probe()
	for _, r := range tried {
		if r.Err != nil {
			fmt.Fprintf(out, "dns watcher   variant %s refused (needs %s): %s\n", r.Name, r.Needs, cli.OneLine(r.Err))
		}
	}
	if err != nil {
		why := "no variant loads"
		if len(tried) == 0 {
			why = cli.OneLine(err)
		}
		fmt.Fprintf(out, "dns watcher   CANNOT LOAD (%s): trace and agent run without remote names and DNS records\n", why)
		return
	}
	v := tried[len(tried)-1].Variant
	lost := "nothing lost"
	if v.Lost != "" {
		lost = "lost: " + v.Lost
	}
	if v.NotesLost != "" {
		// trace and agent read the tracer's notes where its sendmsg
		// programs are attached: the next line says which holds. The
		// rest of Lost is lost either way.
		lost = "lost on its own (its sendmsg programs refused; the next line says whether the tracer's resolver notes stand in): " + v.NotesLost
		if rest := strings.TrimSuffix(strings.TrimSuffix(v.Lost, v.NotesLost), "; "); rest != "" {
			lost = "lost: " + rest + "; " + lost
		}
	}
	how := ""
	if v.PerCall {
		how = ", run by the tracer's send and receive programs on DNS clients' calls"
	}
	fmt.Fprintf(out, "dns watcher   loads: variant %s (%s)%s; %s\n", v.Name, v.Needs, how, lost)
}
