package bundler

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The flow maps hold one value per flow, shared by every CPU: connects
// made at once on two CPUs to one server are counted into one value, which
// the drain reads as such (a per-CPU map's values would not even decode
// into it), named after the process that made them. Through the map, not
// the per-CPU flow cache in front of it.
func TestFlowMapOneValueForEveryCPU(t *testing.T) {
	const port, perCPU = 7415, 50
	testHooks.noCache = true
	defer func() { testHooks.noCache = false }()
	w := newCommitWorld(t, port)
	bu := w.load(t)
	if typ := bu.inner[bu.active].Type(); typ != ebpf.Hash {
		t.Fatalf("flow map of type %v, want %v (one value per flow)", typ, ebpf.Hash)
	}

	// Two of the CPUs this test may run on (one where it has only one).
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < 2; c++ {
		if allowed.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	errs := make([]error, len(cpus))
	var wg sync.WaitGroup
	for i, cpu := range cpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Locked and never unlocked: the pinned thread ends with
			// this goroutine instead of serving others.
			runtime.LockOSThread()
			var set unix.CPUSet
			set.Set(cpu)
			if errs[i] = unix.SchedSetaffinity(0, &set); errs[i] != nil {
				return
			}
			for range perCPU {
				c, err := w.client.Dial("tcp4", w.server)
				if err != nil {
					errs[i] = err
					return
				}
				_, _ = c.Write([]byte("x"))
				c.Close()
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("connects on CPU %d: %v", cpus[i], err)
		}
	}

	now, err := bu.intervalNow()
	if err != nil {
		t.Fatal(err)
	}
	keys, vals, err := bu.readAll(bu.inner[bu.active])
	if err != nil {
		t.Fatalf("read the flow map as one value per flow: %v", err)
	}
	var got []bundlerFlowValue
	for i, k := range keys {
		if k.Netns == w.client.Inode && k.Direction == DirOutbound && k.Port == port {
			got = append(got, vals[i])
		}
	}
	want := uint64(len(cpus) * perCPU)
	if len(got) != 1 || got[0].Gen != now || got[0].Connections != want {
		t.Fatalf("the client's flow: %+v; want one value of interval %d with %d connections from CPUs %v", got, now, want, cpus)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The kernel's comm: the executable's file name, cut to 15 bytes.
	comm := commString(got[0].Comm)
	if got[0].Pid != uint32(os.Getpid()) || comm == "" || !strings.HasPrefix(filepath.Base(exe), comm) {
		t.Errorf("the flow names pid %d %q, want this test's process %d (%s)", got[0].Pid, comm, os.Getpid(), exe)
	}
}
