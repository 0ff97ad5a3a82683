package output

import (
	"encoding/json"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/deptrace/deptrace/tracer"
)

// JSONL writes one JSON object per flow (kind "flow") and per listener
// (kind "listener") per line, byte for byte what encoding/json's Encoder
// writes. Flows are appended by hand: with a thousand client hosts,
// encoding/json (reflection, then compacting each time.Time's output) was
// the agent's biggest cost.
type JSONL struct {
	w   io.Writer
	buf []byte
}

func (j *JSONL) Write(flows []tracer.Flow, listeners []tracer.Listener) error {
	buf := j.buf[:0]
	for _, f := range Sorted(flows) {
		var err error
		if buf, err = appendFlowJSON(buf, f); err != nil {
			return err
		}
		buf = append(buf, '\n')
	}
	for _, l := range listeners { // a few per interval
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		buf = append(append(buf, b...), '\n')
	}
	j.buf = buf
	_, err := j.w.Write(buf)
	return err
}

// appendFlowJSON appends f as json.Marshal would: tracer.Flow's fields in
// order, Counters inlined, peer fields omitted when empty.
func appendFlowJSON(b []byte, f tracer.Flow) ([]byte, error) {
	b = append(b, `{"kind":`...)
	b = appendString(b, f.Kind)
	b = append(b, `,"time":`...)
	b, err := appendTime(b, f.Time)
	if err != nil {
		return b, err
	}
	b = appendUint(b, `,"netns":`, uint64(f.NetNS))
	b = append(b, `,"proto":`...)
	b = appendString(b, f.Proto)
	b = append(b, `,"direction":`...)
	b = appendString(b, f.Direction)
	b = append(b, `,"local_addr":`...)
	b = appendString(b, f.LocalAddr)
	b = append(b, `,"remote_addr":`...)
	b = appendString(b, f.RemoteAddr)
	b = appendUint(b, `,"port":`, uint64(f.Port))
	b = appendUint(b, `,"pid":`, uint64(f.PID))
	b = append(b, `,"comm":`...)
	b = appendString(b, f.Comm)
	b = appendUint(b, `,"cgroup_id":`, f.CgroupID)
	if f.PeerPID != 0 {
		b = appendUint(b, `,"peer_pid":`, uint64(f.PeerPID))
	}
	if f.PeerComm != "" {
		b = append(b, `,"peer_comm":`...)
		b = appendString(b, f.PeerComm)
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
	b = append(b, `,"first_seen":`...)
	if b, err = appendTime(b, f.FirstSeen); err != nil {
		return b, err
	}
	b = append(b, `,"last_seen":`...)
	if b, err = appendTime(b, f.LastSeen); err != nil {
		return b, err
	}
	return append(b, '}'), nil
}

func appendUint(b []byte, key string, v uint64) []byte {
	return strconv.AppendUint(append(b, key...), v, 10)
}

// appendTime is time.Time's MarshalJSON without its allocation; a year
// MarshalJSON refuses is handed to it for its error.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y > 9999 {
		_, err := t.MarshalJSON()
		return b, err
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

// appendString quotes s as encoding/json does. Names and addresses are
// plain ASCII; anything else (control characters, HTML's <>&, non-ASCII)
// goes through encoding/json for its exact escaping.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
