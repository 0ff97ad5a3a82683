package dnswatch

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/kernel"
)

// Variant is one pair of programs of bpf/dns.bpf.c. Kernels differ in
// what cgroup_skb programs may call; the watcher attaches the first
// variant (in Variants' order) that the kernel loads.
type Variant struct {
	// Name is what doctor and the warnings call it.
	Name    string
	egress  string
	ingress string
	// Needs is what the kernel must let cgroup_skb programs call.
	Needs string
	// Lost is what this variant does not see ("" when nothing).
	Lost string
}

// Variants are the program pairs, best first.
var Variants = []Variant{
	{Name: "kctx", egress: dnsProgDnsEgress, ingress: dnsProgDnsIngress,
		Needs: "bpf_cast_to_kern_ctx and bpf_get_current_pid_tgid (6.2 and later)"},
	{Name: "task", egress: dnsProgDnsEgressTask, ingress: dnsProgDnsIngressTask,
		Needs: "bpf_get_current_task and bpf_probe_read_kernel (5.10, 6.1)"},
	{Name: "bare", egress: dnsProgDnsEgressBare, ingress: dnsProgDnsIngressBare,
		Needs: "bpf_probe_read_kernel",
		Lost:  "the querying process (pid 0, no comm): DNS records name the client by cgroup and namespace only"},
}

// variantNames lists the names for error messages.
func variantNames() string {
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

// loadVariant loads v's two programs, the sendmsg programs and the maps;
// where the kernel refuses the sendmsg programs, the rest without them
// (v.Lost says what that misses).
func loadVariant(v Variant) (*kernelSide, error) {
	coll, err := loadPrograms(v.egress, v.ingress, dnsProgDnsSendmsg4, dnsProgDnsSendmsg6)
	if err != nil {
		if coll, _ = loadPrograms(v.egress, v.ingress); coll == nil {
			return nil, err // the first error says most
		}
		v.Lost = strings.TrimPrefix(v.Lost+"; "+noSendto, "; ")
	}
	return &kernelSide{variant: v, coll: coll,
		egress: coll.Programs[v.egress], ingress: coll.Programs[v.ingress],
		sendmsg4: coll.Programs[dnsProgDnsSendmsg4], sendmsg6: coll.Programs[dnsProgDnsSendmsg6],
		events: coll.Maps[dnsMapDnsEvents], stats: coll.Maps[dnsMapDnsStats]}, nil
}

// loadPrograms loads the named programs of bpf/dns.bpf.c and its maps.
func loadPrograms(names ...string) (*ebpf.Collection, error) {
	spec, err := loadDns()
	if err != nil {
		return nil, err
	}
	for name := range spec.Programs {
		if !slices.Contains(names, name) {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollection(spec)
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

// load loads the named variant, or ("") the first of Variants that loads;
// tried lists the variants tried and why each refused.
func load(name string) (k *kernelSide, tried []VariantResult, err error) {
	for _, v := range Variants {
		if name != "" && v.Name != name {
			continue
		}
		k, err := loadVariant(v)
		if err == nil {
			// Its Lost may say more: loaded without the sendmsg programs.
			return k, append(tried, VariantResult{Variant: k.variant}), nil
		}
		tried = append(tried, VariantResult{Variant: v, Err: err})
	}
	if name != "" && len(tried) == 0 {
		return nil, nil, fmt.Errorf("dns: unknown program variant %q: allowed %s", name, variantNames())
	}
	errs := make([]string, len(tried))
	for i, t := range tried {
		errs[i] = fmt.Sprintf("variant %s: %v", t.Name, t.Err)
	}
	return nil, tried, fmt.Errorf("dns: load the kernel side: %s", strings.Join(errs, "; "))
}

// Probe loads each variant in turn (without attaching) until one loads,
// and says how each one tried fared: what doctor reports.
func Probe() ([]VariantResult, error) {
	if err := kernel.Prepare(); err != nil {
		return nil, err
	}
	k, tried, err := load("")
	if k != nil {
		_ = k.Close() // a probe only
	}
	return tried, err
}
