package dnswatch

import "github.com/cilium/ebpf"

// Programs gives the cost benchmark the watcher's programs, to run them
// on crafted packets (BPF_PROG_TEST_RUN).
func (w *Watcher) Programs() (egress, ingress *ebpf.Program) {
	return w.k.egress, w.k.ingress
}
