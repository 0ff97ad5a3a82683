package kernel_test

import (
	"testing"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
)

// Every kernel deptrace is tested on (6.1+) must pass the probes. (On
// 5.10 the kernel matrix's doctor row shows Prepare's ErrTooOld line.)
func TestPrepareOnThisKernel(t *testing.T) {
	testnet.RequireRoot(t)
	if !kernel.HasAtomics() {
		t.Fatal("the atomics probe failed on a kernel that has BPF atomics (5.12+)")
	}
	if err := kernel.Prepare(); err != nil {
		t.Fatal(err)
	}
}
