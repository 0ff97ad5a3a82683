package bundler

import (
	"encoding"
	"unsafe"
)

// MarshalBinary gives the value's bytes as the kernel lays them out.
// cilium/ebpf writes per-CPU batches (the reset of every drained flow)
// one value at a time, through encoding/binary's reflection unless the
// value marshals itself: with 2,000 flows per interval that reflection was
// a sixth of the agent's CPU. bpf2go's struct has the C layout, padding
// included (TestFlowValueMarshalsAsBinaryDoes checks it).
func (v bundlerFlowValue) MarshalBinary() ([]byte, error) {
	return unsafe.Slice((*byte)(unsafe.Pointer(&v)), unsafe.Sizeof(v)), nil
}

// cilium/ebpf uses the method only through this interface.
var _ encoding.BinaryMarshaler = bundlerFlowValue{}
