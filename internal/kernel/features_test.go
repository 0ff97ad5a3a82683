package kernel_test

import (
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
)

func TestPrepareOnThisKernel(t *testing.T) {
	testnet.RequireRoot(t)
	if err := kernel.Prepare(); err != nil {
		t.Fatal(err)
	}
}

// The lines 5.10's verifier printed for deptrace's programs (kernel
// matrix, Debian 5.10.0-46) become one line naming the release needed.
func TestTooOldNamesTheFeatureAndRelease(t *testing.T) {
	log := "load program: invalid argument:\n\tBPF_STX uses reserved fields\n\tprocessed 0 insns (limit 1000000)"
	if got := kernel.TooOld(log); !strings.Contains(got, "Linux 5.12") {
		t.Errorf("TooOld(%q) = %q", log, got)
	}
	if got := kernel.TooOld("R2 type=buf expected=fp"); got != "" {
		t.Errorf("an unrelated rejection became %q", got)
	}
}
