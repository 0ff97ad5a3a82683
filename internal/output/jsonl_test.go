package output

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// encodingJSONLine is what encoding/json's Encoder writes for f, with the
// field jsonl adds: "rtt_avg_us" after "rtt_max_us" (the last such text:
// a string field's copy of it is escaped, and only times follow it).
func encodingJSONLine(t *testing.T, f tracer.Flow) string {
	t.Helper()
	line, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	s := string(line)
	at := strings.LastIndex(s, `,"rtt_max_us":`)
	if at < 0 {
		t.Fatalf("no rtt_max_us in %s", s)
	}
	end := at + len(`,"rtt_max_us":`)
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	return s[:end] + `,"rtt_avg_us":` + strconv.FormatUint(f.RTTAvgUs(), 10) + s[end:] + "\n"
}

// The hand-written flow encoder writes what encoding/json's Encoder writes,
// byte for byte, with rtt_avg_us added, for random flows: strings with
// every kind of character encoding/json escapes, numbers up to the top of
// each type, times in other zones and at their zero, peer and identity
// fields set and empty.
func TestJSONLWritesWhatEncodingJSONWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	pieces := []string{"", "nginx", "10.0.0.1", "2001:db8::1", "/run/app.sock", "@abstract", `q"uote`, `back\slash`,
		"<html>", "a>b", "x&y", "tab\there", "nl\n", "\x00\x01\x1f\x7f", "\b\f", "héllo", "\u2028\u2029", "\xff\xfe bad utf8", "日本"}
	str := func() string {
		var sb strings.Builder
		for range rng.IntN(3) {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return sb.String()
	}
	u64 := func() uint64 {
		switch rng.IntN(3) {
		case 0:
			return 0
		case 1:
			return rng.Uint64()
		}
		return uint64(rng.IntN(100000))
	}
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+30*60), time.FixedZone("X", -8*3600)}
	when := func() time.Time {
		if rng.IntN(5) == 0 {
			return time.Time{}
		}
		sec := rng.Int64N(4e9)
		if rng.IntN(2) == 0 { // a few seconds, as an interval's flows have: the writer's cached text
			sec = 1_800_000_000 + rng.Int64N(20)
		}
		return time.Unix(sec, rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))])
	}
	w := &JSONL{} // one writer for every flow, its cache of times reused
	for i := range 2000 {
		f := tracer.Flow{
			Kind: str(), Time: when(), NetNS: rng.Uint32(), Proto: tracer.Proto(str()), Direction: tracer.Direction(str()),
			LocalAddr: str(), RemoteAddr: str(), Port: uint16(rng.Uint32()), PID: uint32(u64()), Comm: str(),
			CgroupID: u64(), FirstSeen: when(), LastSeen: when(),
		}
		if rng.IntN(2) == 0 {
			f.PeerPID, f.PeerComm = rng.Uint32(), str()
		}
		if rng.IntN(2) == 0 {
			id := &f.Identity
			for _, p := range []*string{&id.Unit, &id.ContainerID, &id.ContainerName, &id.ContainerImage, &id.ContainerRuntime,
				&id.PodNamespace, &id.PodName, &id.PodUID, &id.K8sContainer, &id.Workload} {
				*p = str()
			}
		}
		c := &f.Counters
		for _, p := range []*uint64{&c.Connections, &c.FailedConnections, &c.FailedRefused, &c.FailedTimeout, &c.FailedReset,
			&c.FailedUnreachable, &c.BytesSent, &c.BytesReceived, &c.DatagramsSent, &c.DatagramsReceived,
			&c.ConnectLatencyCount, &c.ConnectLatencySumUs, &c.ConnectLatencyMaxUs, &c.ResetsSent, &c.ResetsReceived, &c.Retransmits,
			&c.RTTSamples, &c.RTTSumUs, &c.RTTMinUs, &c.RTTMaxUs} {
			*p = u64()
		}
		want := encodingJSONLine(t, f)
		var got bytes.Buffer
		w.w = &got
		if err := w.Write([]tracer.Flow{f}, nil); err != nil {
			t.Fatal(err)
		}
		if got.String() != want {
			t.Fatalf("flow %d:\n got %s\nwant %s", i, got.String(), want)
		}
	}
}

// A time encoding/json refuses (a year past 9999) is refused here too,
// with its error and the flow named; the flows before it in the interval
// are written, each on its line, and nothing of the bad one.
func TestJSONLRefusesWhatEncodingJSONRefuses(t *testing.T) {
	good := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 80)
	bad := flow(tracer.Outbound, "tcp", "10.0.0.1", "10.0.0.2", 443) // sorts after good (port)
	bad.LastSeen = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	_, want := json.Marshal(bad)
	var out bytes.Buffer
	err := (&JSONL{w: &out}).Write([]tracer.Flow{bad, good}, nil)
	if want == nil || err == nil || !strings.Contains(err.Error(), "year outside of range") || !strings.Contains(err.Error(), "10.0.0.2 port 443") {
		t.Fatalf("error %v, want one naming the flow and like encoding/json's %v", err, want)
	}
	if line := encodingJSONLine(t, good); out.String() != line {
		t.Errorf("written %q, want only the good flow's line %q", out.String(), line)
	}
}

// Intervals written one after another through one writer (its buffer
// reused) come out as encoding/json's Encoder writes them (flows with
// rtt_avg_us added), listeners after the flows.
func TestJSONLSeveralIntervals(t *testing.T) {
	var got, want bytes.Buffer
	w := &JSONL{w: &got}
	enc := json.NewEncoder(&want)
	for i := range 3 {
		flows := []tracer.Flow{flow(tracer.Inbound, "tcp", "10.0.0.1", "10.0.0.3", 80), flow(tracer.Outbound, "udp", "10.0.0.1", "10.0.0.2", 53)}
		flows[0].Connections = uint64(i)
		ls := []tracer.Listener{{Kind: tracer.KindListener, Proto: "tcp", LocalAddr: "10.0.0.1", Port: 80, Drops: uint64(i)}}
		if err := w.Write(flows, ls); err != nil {
			t.Fatal(err)
		}
		for _, f := range Sorted(flows) {
			want.WriteString(encodingJSONLine(t, *f))
		}
		if err := enc.Encode(ls[0]); err != nil {
			t.Fatal(err)
		}
	}
	if got.String() != want.String() {
		t.Errorf("got\n%s\nwant\n%s", got.String(), want.String())
	}
}
