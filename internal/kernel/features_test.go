package kernel_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

// On a kernel at least as new as 5.12 (every kernel the suite runs on but
// the matrix's 5.10 guest, where `deptrace doctor` shows the line), a
// refused map keeps its own error.
func TestTooOldForMapsOnlyBelow512(t *testing.T) {
	if got := kernel.TooOldForMaps(nil); got != "" {
		t.Errorf("no error: %q", got)
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	_, _ = fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor) // a release without major.minor leaves 0.0, the oldest
	got := kernel.TooOldForMaps(errors.New("map x: map create: invalid argument"))
	if old := major < 5 || (major == 5 && minor < 12); old != (got != "") {
		t.Errorf("release %d.%d: TooOldForMaps = %q", major, minor, got)
	}
}
