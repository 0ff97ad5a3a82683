package dnswatch

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/kernel"
)

// Variant is one pair of programs of bpf/dns.bpf.c: one of the
// per-packet pairs (cgroup_skb), which differ in what the kernel lets
// them call, or the per-call pair (run on send and receive calls). Unless
// told which, the watcher loads the per-call pair where the tracer hands
// it calls (Config.Calls), and otherwise the first per-packet variant (in
// Variants' order) that the kernel loads.
type Variant struct {
	// Name is what doctor and the warnings call it.
	Name    string
	egress  string
	ingress string
	// PerCall: egress and ingress are tp_btf programs on the send and
	// receive calls, not cgroup_skb programs on packets. The default
	// where the tracer hands them its calls (a tail call from its own
	// programs on the same tracepoints: Config.Calls); without such a
	// tracer they are attached on their own, beside the tracer's, where
	// they cost more than the per-packet pair on persistent TCP and UDP
	// (docs/performance.md, "DNS watching"): only when Config names the
	// variant.
	PerCall bool
	// Needs is what the kernel must offer the programs.
	Needs string
	// Lost is what this variant does not see ("" when nothing).
	Lost string
	// NotesLost is the part of Lost that comes of the kernel refusing the
	// variant's own sendmsg programs ("" when they loaded, or a tracer's
	// notes were used). With a tracer whose sendmsg programs are attached
	// the variant reads the tracer's notes instead and does not lose it
	// (Watcher.OwnNotes).
	NotesLost string
}

// Variants are the program pairs: the per-packet ones best first, then
// the per-call one.
var Variants = []Variant{
	{Name: "kctx", egress: dnsProgDnsEgress, ingress: dnsProgDnsIngress,
		Needs: "bpf_cast_to_kern_ctx and bpf_get_current_pid_tgid (6.2 and later)"},
	{Name: "task", egress: dnsProgDnsEgressTask, ingress: dnsProgDnsIngressTask,
		Needs: "bpf_get_current_task and bpf_probe_read_kernel (5.10, 6.1)"},
	{Name: "bare", egress: dnsProgDnsEgressBare, ingress: dnsProgDnsIngressBare,
		Needs: "bpf_probe_read_kernel",
		Lost:  "the querying process (pid 0, no comm): DNS records name the client by cgroup and namespace only"},
	{Name: perCallName, egress: dnsProgDnsSend, ingress: dnsProgDnsRecv, PerCall: true,
		Needs: "the sock_send_length and sock_recv_length tracepoints (6.3 and later), bpf_task_pt_regs and task storage"},
}

// perCallName is the per-call variant's name.
const perCallName = "call"

// VariantNames lists the variants' names, for flags and error messages.
func VariantNames() string {
	names := make([]string, len(Variants))
	for i, v := range Variants {
		names[i] = v.Name
	}
	return strings.Join(names, ", ")
}

func lookupVariant(name string) (Variant, bool) {
	for _, v := range Variants {
		if v.Name == name {
			return v, true
		}
	}
	return Variant{}, false
}

// kernelSide is one variant's programs and the maps they share.
type kernelSide struct {
	variant Variant
	coll    *ebpf.Collection
	egress  *ebpf.Program
	ingress *ebpf.Program
	// sendmsg4/6 note the resolver of a sendto() to port 53 before a NAT
	// rule changes it (the same in every variant).
	sendmsg4, sendmsg6 *ebpf.Program
	events             *ebpf.Map
	stats              *ebpf.Map
}

func (k *kernelSide) Close() error {
	if k == nil || k.coll == nil {
		return nil
	}
	k.coll.Close()
	return nil
}

// noSendto is what a variant loaded without its sendmsg programs (a
// kernel that refuses socket storage in them) does not see.
const noSendto = "queries sent with sendto() to an address a NAT rule redirects (musl's resolver behind Docker's 127.0.0.11): their answers count without queries or latency"

// noSendtoPerCall is what the per-call variant loaded without them does
// not see: it takes an unconnected socket for a resolver's only by their
// notes.
const noSendtoPerCall = "lookups on unconnected UDP sockets (sendto() to port 53, as musl's resolver sends): neither queries nor answers are seen"

// loadVariant loads v's two programs, the sendmsg programs and the maps;
// where the kernel refuses the sendmsg programs, the rest without them
// (v.Lost says what that misses). With dests (the tracer's resolver
// notes, which its own sendmsg programs write) the programs read those,
// and the watcher's sendmsg programs are not loaded.
func loadVariant(v Variant, dests *ebpf.Map) (*kernelSide, error) {
	if dests != nil {
		coll, err := loadPrograms(dests, v.egress, v.ingress)
		if err != nil {
			return nil, err
		}
		return &kernelSide{variant: v, coll: coll,
			egress: coll.Programs[v.egress], ingress: coll.Programs[v.ingress],
			events: coll.Maps[dnsMapDnsEvents], stats: coll.Maps[dnsMapDnsStats]}, nil
	}
	coll, err := loadPrograms(nil, v.egress, v.ingress, dnsProgDnsSendmsg4, dnsProgDnsSendmsg6)
	if err != nil {
		if coll, _ = loadPrograms(nil, v.egress, v.ingress); coll == nil {
			return nil, err // the first error says most
		}
		lost := noSendto
		if v.PerCall {
			lost = noSendtoPerCall
		}
		v.Lost = strings.TrimPrefix(v.Lost+"; "+lost, "; ")
		v.NotesLost = lost
	}
	return &kernelSide{variant: v, coll: coll,
		egress: coll.Programs[v.egress], ingress: coll.Programs[v.ingress],
		sendmsg4: coll.Programs[dnsProgDnsSendmsg4], sendmsg6: coll.Programs[dnsProgDnsSendmsg6],
		events: coll.Maps[dnsMapDnsEvents], stats: coll.Maps[dnsMapDnsStats]}, nil
}

// perCallMaps are the maps only the per-call programs use: a kernel
// without task storage (5.10) could not make them.
var perCallMaps = []string{dnsMapDnsMcalls, dnsMapDnsCallScratch}

// loadPrograms loads the named programs of bpf/dns.bpf.c and the maps
// they use; dests, when not nil, in place of their own resolver notes.
func loadPrograms(dests *ebpf.Map, names ...string) (*ebpf.Collection, error) {
	spec, err := loadDns()
	if err != nil {
		return nil, err
	}
	perCall := false
	for name := range spec.Programs {
		if !slices.Contains(names, name) {
			delete(spec.Programs, name)
		} else if name == dnsProgDnsSend || name == dnsProgDnsRecv {
			perCall = true
		}
	}
	if !perCall {
		for _, m := range perCallMaps {
			delete(spec.Maps, m)
		}
	}
	var opts ebpf.CollectionOptions
	if dests != nil {
		opts.MapReplacements = map[string]*ebpf.Map{dnsMapDnsDests: dests}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, ve
		}
		return nil, err
	}
	return coll, nil
}

// VariantResult is whether one variant loads here.
type VariantResult struct {
	Variant
	Err error // nil: it loads
}

// load loads the named variant, or ("") the first per-packet one of
// Variants that loads, with dests as loadVariant's; tried lists the
// variants tried and why each refused.
func load(name string, dests *ebpf.Map) (k *kernelSide, tried []VariantResult, err error) {
	for _, v := range Variants {
		if name != "" && v.Name != name || name == "" && v.PerCall {
			continue
		}
		k, err := loadVariant(v, dests)
		if err == nil {
			// Its Lost may say more: loaded without the sendmsg programs.
			return k, append(tried, VariantResult{Variant: k.variant}), nil
		}
		tried = append(tried, VariantResult{Variant: v, Err: err})
	}
	if name != "" && len(tried) == 0 {
		return nil, nil, fmt.Errorf("dns: unknown program variant %q: allowed %s", name, VariantNames())
	}
	errs := make([]string, len(tried))
	for i, t := range tried {
		errs[i] = fmt.Sprintf("variant %s: %v", t.Name, t.Err)
	}
	return nil, tried, fmt.Errorf("dns: load the kernel side: %s", strings.Join(errs, "; "))
}

// Probe loads the variants trace and agent would, in their order,
// without attaching them, until one loads, and says how each one tried
// fared: what doctor reports. On a kernel with the byte tracepoints (6.3
// and later), where the tracer hands its calls to the per-call programs,
// that one first.
func Probe() ([]VariantResult, error) {
	if err := kernel.Prepare(); err != nil {
		return nil, err
	}
	var (
		k     *kernelSide
		tried []VariantResult
		err   error
	)
	if kernel.Has("btf_trace_sock_send_length") && kernel.Has("btf_trace_sock_recv_length") {
		k, tried, err = load(perCallName, nil)
	}
	if k == nil {
		var more []VariantResult
		k, more, err = load("", nil)
		tried = append(tried, more...)
	}
	if k != nil {
		_ = k.Close() // a probe only
	}
	return tried, err
}
