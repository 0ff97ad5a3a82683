package bundler

import (
	"crypto/sha256"
	"fmt"
	"reflect"
	"testing"
)

// layoutFingerprints are the fingerprints of the flow key, flow value and
// slot layouts, by flowLayout. A change to any of them must come with a new
// flowLayout (pin.go), so that a replaced side of the old layout is never
// decoded as the new one.
var layoutFingerprints = map[uint32]string{
	2: "2d071c76",
	3: "edf301a0",
	4: "8449933d",
	5: "8449933d", // 4's value layout in flow maps that are no longer per CPU
}

func layoutFingerprint() string {
	h := sha256.New()
	for _, v := range []any{bundlerFlowKey{}, bundlerFlowValue{}, bundlerSpillSlot{}} {
		t := reflect.TypeOf(v)
		fmt.Fprintf(h, "%s %d;", t.Name(), t.Size())
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			fmt.Fprintf(h, "%s %s %d;", f.Name, f.Type, f.Offset)
		}
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:4])
}

func TestFlowLayoutFingerprint(t *testing.T) {
	got := layoutFingerprint()
	want, ok := layoutFingerprints[flowLayout]
	if !ok || got != want {
		t.Fatalf("flow layout fingerprint %s, recorded for flowLayout %d: %q. The key, value or slot layout changed: bump flowLayout in pin.go and record %s under it", got, flowLayout, want, got)
	}
}

// A drained cache slot keeps a flow that counted, zeroed but for its
// process, and frees one that did not.
func TestCacheResetKeepsCountingFlowsNamed(t *testing.T) {
	ready := uint32(bundlerSpillStateSPILL_READY)
	var counted, idle bundlerSpillSlot
	counted.State, counted.Key.Port = ready, 80
	counted.Value.Connections, counted.Value.BytesSent, counted.Value.LastJiffies = 3, 100, 7
	counted.Value.Pid, counted.Value.CgroupId = 42, 9
	for i, c := range "nginx" {
		counted.Value.Comm[i] = int8(c)
	}
	idle.State, idle.Key.Port = ready, 81
	idle.Value.Pid = 43
	got := cacheReset([]bundlerSpillSlot{counted, idle, {}})

	want := bundlerSpillSlot{State: ready}
	want.Key.Port = 80
	want.Value.Pid, want.Value.CgroupId, want.Value.Comm = 42, 9, counted.Value.Comm
	if got[0] != want {
		t.Errorf("counted slot after reset: %+v, want %+v", got[0], want)
	}
	if got[1] != (bundlerSpillSlot{}) || got[2] != (bundlerSpillSlot{}) {
		t.Errorf("idle and free slots after reset: %+v, %+v; want both free", got[1], got[2])
	}
}
