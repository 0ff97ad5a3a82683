package kernel

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
)

// ErrTooOld is returned when the kernel lacks a BPF feature deptrace's
// programs cannot do without; the message names it and the first Linux
// release that has it.
var ErrTooOld = errors.New("kernel too old")

// HasAtomics reports whether the verifier accepts BPF atomic
// compare-and-exchange (Linux 5.12+), which deptrace's programs use so
// that a drain and a socket's close never count a byte twice. Probed once
// by loading a four-instruction program.
var HasAtomics = sync.OnceValue(func() bool {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 0),
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
			asm.Mov.Imm(asm.R2, 1),
			asm.CmpXchg.Mem(asm.RFP, asm.R2, asm.DWord, -8),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	if err != nil {
		return false
	}
	prog.Close()
	return true
})

// Prepare checks what must hold before anything is loaded: BPF maps can be
// created (kernels before 5.11 charge them to RLIMIT_MEMLOCK: the limit is
// raised, which needs CAP_SYS_RESOURCE or a high enough hard limit), and
// the verifier knows the atomics deptrace uses.
func Prepare() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("this kernel charges BPF maps to the locked-memory limit (Linux before 5.11) and raising it failed (%v): run deptrace with `ulimit -l unlimited` (LimitMEMLOCK=infinity under systemd)", err)
	}
	if !HasAtomics() {
		return fmt.Errorf("%w: the BPF verifier has no atomic compare-and-exchange, which arrived in Linux 5.12; deptrace needs Linux 5.12 or newer (6.1 or newer is tested, see docs/install.md)", ErrTooOld)
	}
	return nil
}
