package output

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/deptrace/deptrace/internal/jsonenc"
	"github.com/deptrace/deptrace/tracer"
)

// JSONL writes one JSON object per flow (kind "flow") and per listener
// (kind "listener") per line, byte for byte what encoding/json's Encoder
// writes, except that a flow also carries its average RTT, "rtt_avg_us"
// (Counters.RTTAvgUs), after "rtt_max_us": a reader of the line should not
// have to divide. Flows are appended by hand: with a thousand client
// hosts, encoding/json (reflection, then compacting each time.Time's
// output) was the agent's biggest cost.
type JSONL struct {
	w     io.Writer
	buf   []byte
	times jsonenc.Times
}

// Write writes the interval's flows, sorted, then its listeners. A record
// encoding/json would refuse (a time out of its range) stops the interval
// there: the lines before it are written, and the error names the record.
func (j *JSONL) Write(flows []tracer.Flow, listeners []tracer.Listener) error {
	buf, err := j.appendInterval(j.buf[:0], flows, listeners)
	j.buf = buf
	if len(buf) > 0 { // an idle interval writes nothing, as before
		if _, werr := j.w.Write(buf); werr != nil {
			return werr
		}
	}
	return err
}

func (j *JSONL) appendInterval(buf []byte, flows []tracer.Flow, listeners []tracer.Listener) ([]byte, error) {
	for _, f := range Sorted(flows) {
		line, err := appendFlowJSON(buf, f, &j.times)
		if err != nil {
			return buf, fmt.Errorf("jsonl: flow %s %s %s -> %s port %d: %w", f.Proto, f.Direction, f.LocalAddr, f.RemoteAddr, f.Port, err)
		}
		buf = append(line, '\n')
	}
	for _, l := range listeners { // a few per interval
		b, err := json.Marshal(l)
		if err != nil {
			return buf, fmt.Errorf("jsonl: listener %s %s port %d: %w", l.Proto, l.LocalAddr, l.Port, err)
		}
		buf = append(append(buf, b...), '\n')
	}
	return buf, nil
}

// appendFlowJSON appends f as json.Marshal would, with "rtt_avg_us" after
// "rtt_max_us": tracer.Flow's fields in order, Counters inlined, identity
// and peer fields omitted when empty.
func appendFlowJSON(b []byte, f *tracer.Flow, times *jsonenc.Times) ([]byte, error) {
	b = append(b, `{"kind":`...)
	b = jsonenc.AppendString(b, f.Kind)
	b = append(b, `,"time":`...)
	b, err := times.Append(b, f.Time)
	if err != nil {
		return b, err
	}
	b = appendUint(b, `,"netns":`, uint64(f.NetNS))
	b = append(b, `,"proto":`...)
	b = jsonenc.AppendString(b, string(f.Proto))
	b = append(b, `,"direction":`...)
	b = jsonenc.AppendString(b, string(f.Direction))
	b = append(b, `,"local_addr":`...)
	b = jsonenc.AppendString(b, f.LocalAddr)
	b = append(b, `,"remote_addr":`...)
	b = jsonenc.AppendString(b, f.RemoteAddr)
	b = appendUint(b, `,"port":`, uint64(f.Port))
	b = appendUint(b, `,"pid":`, uint64(f.PID))
	b = append(b, `,"comm":`...)
	b = jsonenc.AppendString(b, f.Comm)
	b = appendUint(b, `,"cgroup_id":`, f.CgroupID)
	if !f.Identity.Empty() {
		b = appendIdentity(b, &f.Identity)
	}
	if f.RemoteName != "" {
		b = append(b, `,"remote_name":`...)
		b = jsonenc.AppendString(b, f.RemoteName)
	}
	if f.PeerPID != 0 {
		b = appendUint(b, `,"peer_pid":`, uint64(f.PeerPID))
	}
	if f.PeerComm != "" {
		b = append(b, `,"peer_comm":`...)
		b = jsonenc.AppendString(b, f.PeerComm)
	}
	c := f.Counters
	b = appendUint(b, `,"connections":`, c.Connections)
	b = appendUint(b, `,"failed_connections":`, c.FailedConnections)
	b = appendUint(b, `,"failed_refused":`, c.FailedRefused)
	b = appendUint(b, `,"failed_timeout":`, c.FailedTimeout)
	b = appendUint(b, `,"failed_reset":`, c.FailedReset)
	b = appendUint(b, `,"failed_unreachable":`, c.FailedUnreachable)
	b = appendUint(b, `,"bytes_sent":`, c.BytesSent)
	b = appendUint(b, `,"bytes_received":`, c.BytesReceived)
	b = appendUint(b, `,"datagrams_sent":`, c.DatagramsSent)
	b = appendUint(b, `,"datagrams_received":`, c.DatagramsReceived)
	b = appendUint(b, `,"connect_latency_count":`, c.ConnectLatencyCount)
	b = appendUint(b, `,"connect_latency_sum_us":`, c.ConnectLatencySumUs)
	b = appendUint(b, `,"connect_latency_max_us":`, c.ConnectLatencyMaxUs)
	b = appendUint(b, `,"resets_sent":`, c.ResetsSent)
	b = appendUint(b, `,"resets_received":`, c.ResetsReceived)
	b = appendUint(b, `,"retransmits":`, c.Retransmits)
	b = appendUint(b, `,"rtt_samples":`, c.RTTSamples)
	b = appendUint(b, `,"rtt_sum_us":`, c.RTTSumUs)
	b = appendUint(b, `,"rtt_min_us":`, c.RTTMinUs)
	b = appendUint(b, `,"rtt_max_us":`, c.RTTMaxUs)
	b = appendUint(b, `,"rtt_avg_us":`, c.RTTAvgUs())
	b = append(b, `,"first_seen":`...)
	if b, err = times.Append(b, f.FirstSeen); err != nil {
		return b, err
	}
	b = append(b, `,"last_seen":`...)
	if b, err = times.Append(b, f.LastSeen); err != nil {
		return b, err
	}
	return append(b, '}'), nil
}

// appendIdentity appends the identity fields that are set, in
// tracer.Identity's order (each is omitempty).
func appendIdentity(b []byte, id *tracer.Identity) []byte {
	for _, kv := range [...]struct{ key, v string }{
		{`,"unit":`, id.Unit}, {`,"container_id":`, id.ContainerID}, {`,"container_name":`, id.ContainerName},
		{`,"container_image":`, id.ContainerImage}, {`,"container_runtime":`, id.ContainerRuntime},
		{`,"pod_namespace":`, id.PodNamespace}, {`,"pod_name":`, id.PodName}, {`,"pod_uid":`, id.PodUID},
		{`,"k8s_container":`, id.K8sContainer}, {`,"workload":`, id.Workload},
	} {
		if kv.v != "" {
			b = jsonenc.AppendString(append(b, kv.key...), kv.v)
		}
	}
	return b
}

func appendUint(b []byte, key string, v uint64) []byte {
	return strconv.AppendUint(append(b, key...), v, 10)
}
