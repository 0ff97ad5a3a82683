package bundler

import "testing"

// A value whose process a program was writing when it was read (pid
// PID_NAMING: only a salvaged side's, whose programs may still run) names
// no process: the flow takes the process of another value, even one seen
// earlier.
func TestMergeSkipsAProcessBeingNamed(t *testing.T) {
	curl := [16]int8{'c', 'u', 'r', 'l'}
	vals := []bundlerFlowValue{
		{Connections: 1, LastSeenNs: 10, Pid: 42, CgroupId: 7, Comm: curl, PeerPid: 43, PeerComm: curl},
		{Connections: 2, LastSeenNs: 20, Pid: pidNaming, CgroupId: 8},
		{Connections: 4, LastSeenNs: 30, Pid: 44, CgroupId: 9, Comm: curl, PeerPid: pidNaming},
	}
	e := merge(bundlerFlowKey{}, vals[:2])
	if e.PID != 42 || e.CgroupID != 7 || e.Comm != "curl" || e.PeerPID != 43 || e.Connections != 3 {
		t.Errorf("merged %+v: want pid 42 of cgroup 7, peer 43, 3 connections", e)
	}
	e = merge(bundlerFlowKey{}, vals)
	if e.PID != 44 || e.CgroupID != 9 || e.PeerPID != 43 || e.Connections != 7 {
		t.Errorf("merged %+v: want pid 44 of cgroup 9, peer 43 (the newest value's being named), 7 connections", e)
	}
	// Nor does a value being named give its cgroup to a flow no value
	// names a process of.
	e = merge(bundlerFlowKey{}, []bundlerFlowValue{vals[1], {Connections: 1, CgroupId: 5}})
	if e.PID != 0 || e.CgroupID != 5 {
		t.Errorf("merged %+v: want no process, cgroup 5", e)
	}
}

// decode builds an interval's entries in the last committed interval's
// memory when it is large enough, and they are what a fresh slice holds:
// nothing of the entries that were there before is left.
func TestDecodeReusesTheCommittedEntries(t *testing.T) {
	curl := [16]int8{'c', 'u', 'r', 'l'}
	var keys []bundlerFlowKey
	var vals []bundlerFlowValue
	for i := range 3 {
		k := bundlerFlowKey{Netns: 4026531840, Port: uint16(8080 + i), Proto: 6, Direction: DirOutbound}
		k.LocalAddr[10], k.LocalAddr[11], k.LocalAddr[12] = 0xff, 0xff, 127
		k.RemoteAddr[10], k.RemoteAddr[11], k.RemoteAddr[12] = 0xff, 0xff, 127
		keys = append(keys, k)
		vals = append(vals, bundlerFlowValue{Connections: uint64(i + 1), LastSeenNs: 10, Pid: uint32(40 + i), Comm: curl})
	}
	fresh := (&Bundler{}).decode(keys, vals, spillRead{})
	if len(fresh) != 3 {
		t.Fatalf("decoded %d entries, want 3", len(fresh))
	}

	stale := Entry{Comm: "stale", Path: "/stale", PeerPID: 9, PeerComm: "stale", Counts: Counts{Connections: 1000}}
	spare := []Entry{stale, stale, stale, stale}[:0]
	b := &Bundler{}
	b.drain.spareEntries = spare
	got := b.decode(keys, vals, spillRead{})
	if len(got) != 3 || &got[0] != &spare[:1][0] {
		t.Fatalf("decoded %d entries, in the spare's memory: %v; want 3 in it", len(got), len(got) > 0 && &got[0] == &spare[:1][0])
	}
	if b.drain.spareEntries != nil {
		t.Error("the spare entries are still kept for another decode after this one took them")
	}
	for i := range got {
		if got[i] != fresh[i] {
			t.Errorf("entry %d: %+v in reused memory, want %+v", i, got[i], fresh[i])
		}
	}

	b.drain.spareEntries = []Entry{stale}[:0] // too small: a new slice
	if got := b.decode(keys, vals, spillRead{}); len(got) != 3 || got[0] != fresh[0] {
		t.Fatalf("decoded %+v with a spare too small, want %+v", got, fresh)
	}
}
