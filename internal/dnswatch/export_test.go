package dnswatch

import "github.com/cilium/ebpf"

// Programs gives the cost benchmark the watcher's programs, to run them
// on crafted packets (BPF_PROG_TEST_RUN).
func (w *Watcher) Programs() (egress, ingress *ebpf.Program) {
	return w.k.egress, w.k.ingress
}

// OwnNotes says whether the watcher loaded (and so attached) its own
// sendmsg programs, which note resolvers; handed the tracer's calls it
// reads the tracer's notes instead.
func (w *Watcher) OwnNotes() bool {
	return w.k.sendmsg4 != nil || w.k.sendmsg6 != nil
}
