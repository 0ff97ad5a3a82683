package tracer

// mergeSameFlows merges the udp and unix flows of one interval that name
// the same dependency, in place, keeping the order of the first of each,
// and returns the shortened slice. The kernel keys the datagrams of an
// unconnected socket bound to a wildcard by the wildcard; once flowsOf
// names such a flow by its routed source, it is the flow of a connected
// socket (or of one bound to that source) to the same peer: one
// dependency, one line. A unix server's flows from clients of one name in
// several namespaces become one once flowsOf puts them in the server's
// (unixServerNetNS); other clients and other servers stay apart.
func mergeSameFlows(flows []Flow) []Flow {
	type flowKey struct {
		netns         uint32
		proto         Proto
		dir           Direction
		local, remote string
		port          uint16
		// unix: both processes. Two servers of one path in one network
		// namespace (host-network containers, each with its own mount
		// namespace) stay apart, as clients of other names do.
		comm, peerComm string
		cgroup         uint64
	}
	at := map[flowKey]int{}
	out := flows[:0]
	for _, f := range flows {
		if f.Proto != ProtoUDP && f.Proto != ProtoUnix {
			out = append(out, f)
			continue
		}
		k := flowKey{netns: f.NetNS, proto: f.Proto, dir: f.Direction, local: f.LocalAddr, remote: f.RemoteAddr, port: f.Port}
		if f.Proto == ProtoUnix {
			k.comm, k.peerComm, k.cgroup = f.Comm, f.PeerComm, f.CgroupID
		}
		if i, ok := at[k]; ok {
			mergeFlow(&out[i], f)
			continue
		}
		at[k] = len(out)
		out = append(out, f)
	}
	clear(flows[len(out):]) // no stale copies keep their strings alive
	return out
}

// mergeFlow merges f, a flow of the same dependency and interval, into
// dst: counters add up, the times span both, and the process is the one
// of the flow seen last.
func mergeFlow(dst *Flow, f Flow) {
	merged := *dst
	if namesBetter(f, *dst) {
		merged = f
	}
	merged.Counters = dst.Counters
	merged.Counters.Add(f.Counters)
	merged.FirstSeen, merged.LastSeen = dst.FirstSeen, dst.LastSeen
	if f.FirstSeen.Before(merged.FirstSeen) {
		merged.FirstSeen = f.FirstSeen
	}
	if f.LastSeen.After(merged.LastSeen) {
		merged.LastSeen = f.LastSeen
	}
	*dst = merged
}

// namesBetter reports whether a's process, rather than b's, names the
// merged flow of both: one with a process over one without, then the one
// seen last; on a tie the larger pid, whatever order the kernel map gave.
func namesBetter(a, b Flow) bool {
	if (a.PID == 0) != (b.PID == 0) {
		return a.PID != 0
	}
	if !a.LastSeen.Equal(b.LastSeen) {
		return a.LastSeen.After(b.LastSeen)
	}
	if a.PID != b.PID {
		return a.PID > b.PID
	}
	if a.CgroupID != b.CgroupID {
		return a.CgroupID > b.CgroupID
	}
	return a.Comm > b.Comm
}
