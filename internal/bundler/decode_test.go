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
