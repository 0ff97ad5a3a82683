package bundler

import (
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
)

func testConfig() Config {
	return Config{FlowMapSize: 4096, PortMapSize: 1024, SyscallTracepoints: true}
}

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
	hooks := b.Hooks()
	for _, h := range hooks {
		if h.Active || h.Standby || b.replaced(h.Program) {
			continue
		}
		t.Errorf("hook %s (%s) inactive and not replaced: %s\n%s", h.Hook, h.Program, h.Reason, h.Log)
	}
	for _, h := range hooks {
		if h.Replaces != "" && !h.Standby && !h.Active {
			t.Errorf("fallback %s needed (its tracepoint is missing) but inactive: %s\n%s", h.Hook, h.Reason, h.Log)
		}
	}
	if _, err := b.Seed(); err != nil {
		t.Fatalf("seed: %v", err)
	}
	if _, _, err := b.Drain(); err != nil {
		t.Fatalf("drain: %v", err)
	}
}
