package measure

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
)

// The floor probe runs on receives at each of its hooks: the tracepoint
// where the kernel has it (6.3 and later), the exit of sock_recvmsg where
// the kernel permits fexit (the fallback before 6.3, tried here directly).
// Its count is the machine's, every process's receives included, so the
// test asserts at least one run per receive of its own and a time per
// run: a probe that never ran would leave the net figures unmeasured.
func TestFloorProbeRunsOnReceives(t *testing.T) {
	testnet.RequireRoot(t)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	server, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	client, err := net.Dial("udp4", server.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const receives = 200
	for _, h := range floorHooks {
		kind, fn, _ := strings.Cut(h, "/")
		if kind == "tp_btf" && !kernel.Has("btf_trace_"+fn) {
			t.Logf("%s: the kernel has no such tracepoint (before 6.3); the fallback is tried next", h)
			continue
		}
		f, err := attachFloorProbeAt(h)
		if kind == "fexit" && errors.Is(err, unix.EPERM) {
			// This project's own VM kernel permits no fexit; Debian's
			// kernels do (the full kernel matrix runs this test there).
			t.Logf("%s: this kernel does not permit fexit programs (%v)", h, err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		if err := f.start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 16)
		for range receives {
			if _, err := client.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			if _, _, err := server.ReadFrom(buf); err != nil {
				t.Fatal(err)
			}
		}
		s, err := f.prog.Stats()
		if err != nil {
			t.Fatal(err)
		}
		ns, err := f.nsPerRun()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if runs := s.RunCount - f.runs; runs < receives {
			t.Errorf("%s: the probe ran %d times for %d receives", h, runs, receives)
		}
		if ns <= 0 {
			t.Errorf("%s: %.1f ns per run with bpf_stats on", h, ns)
		}
		t.Logf("%s: %.1f ns per run", h, ns)
	}
	// attachFloorProbe takes the first hook the kernel allows.
	f, err := attachFloorProbe()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := "fexit/sock_recvmsg"
	if kernel.Has("btf_trace_sock_recv_length") {
		want = "tp_btf/sock_recv_length"
	}
	if f.hook != want {
		t.Errorf("the floor probe went to %s, want %s on this kernel", f.hook, want)
	}
}
