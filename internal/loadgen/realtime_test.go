package loadgen

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/testnet"
)

// Every thread, and one started afterwards, runs under SCHED_FIFO. In a
// child process, so that no other test runs at real-time priority.
func TestRealtimeSwitchesEveryThread(t *testing.T) {
	if os.Getenv("LOADGEN_REALTIME_CHILD") == "1" {
		if err := Realtime(); err != nil {
			t.Fatal(err)
		}
		started := make(chan int)
		go func() {
			runtime.LockOSThread() // a thread of its own, possibly a new one
			started <- unix.Gettid()
		}()
		<-started
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			attr, err := unix.SchedGetAttr(tid, 0)
			if err != nil {
				continue // the thread ended
			}
			if attr.Policy != unix.SCHED_FIFO || attr.Priority != 1 {
				t.Errorf("thread %d: policy %d priority %d, want SCHED_FIFO (%d) 1", tid, attr.Policy, attr.Priority, unix.SCHED_FIFO)
			}
		}
		return
	}
	testnet.RequireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestRealtimeSwitchesEveryThread$", "-test.v")
	cmd.Env = append(os.Environ(), "LOADGEN_REALTIME_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
