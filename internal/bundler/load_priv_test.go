package bundler

import (
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
)

func testConfig() Config { return Config{FlowMapSize: 4096, PortMapSize: 1024} }

// Every hook must load and attach on the kernels deptrace is tested on;
// the verifier log of one that does not is printed in full.
func TestEveryHookLoads(t *testing.T) {
	testnet.RequireRoot(t)
	b, err := Load(testConfig())
	if err != nil {
		if rh, ok := err.(*RequiredHookError); ok {
			t.Fatalf("%v\n%s", err, rh.Hook.Log)
		}
		t.Fatal(err)
	}
	defer b.Close()
	for _, h := range b.Hooks() {
		if !h.Active && !h.Standby {
			t.Errorf("hook %s (%s) inactive: %s\n%s", h.Hook, h.Program, h.Reason, h.Log)
		}
	}
	if _, err := b.Seed(); err != nil {
		t.Fatalf("seed: %v", err)
	}
	if _, _, err := b.Drain(); err != nil {
		t.Fatalf("drain: %v", err)
	}
}
