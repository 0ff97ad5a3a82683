package loadgen

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Realtime puts every thread of this process under SCHED_FIFO at
// priority 1; threads started later inherit it from the thread that
// starts them. A paced load then gets the CPU it needs on a machine
// shared with other work, which otherwise holds it below its rate (nice
// does not help when the other work is in other cgroups). The kernel's
// real-time throttling (kernel.sched_rt_runtime_us) still leaves the
// rest of the machine its share. Needs CAP_SYS_NICE.
func Realtime() error {
	done := map[int]bool{}
	// A thread started during a pass by a thread not yet switched is
	// found by the next pass.
	for pass := 0; pass < 10; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("list own threads: %w", err)
		}
		switched := 0
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || done[tid] {
				continue
			}
			err = unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 1}, 0)
			if err != nil && err != unix.ESRCH {
				return fmt.Errorf("SCHED_FIFO for thread %d: %w (needs CAP_SYS_NICE)", tid, err)
			}
			done[tid] = true
			switched++
		}
		if switched == 0 {
			return nil
		}
	}
	return fmt.Errorf("SCHED_FIFO: this process kept starting threads")
}
