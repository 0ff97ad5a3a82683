package tracer_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

// tcpServerEnv makes this test binary a TCP echo server on loopback (see
// TestMain): the server of the listener cgroup tests is a process of its
// own, in a cgroup of its own.
const tcpServerEnv = "DEPTRACE_TEST_TCP_SERVER"

// serveTCP is the server process of TestListenerCgroup* (see
// tcpServerEnv): it listens on a port the kernel chooses, prints it,
// echoes every connection, and returns when stdin closes.
func serveTCP() int {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("port %d\n", ln.Addr().(*net.TCPAddr).Port)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	_, _ = io.Copy(io.Discard, os.Stdin)
	ln.Close()
	return 0
}

// newCgroup makes a cgroup v2 directory for this test, removed when the
// test ends (after the processes in it, cleaned up later, are gone), and
// returns its path and id (the directory's inode).
func newCgroup(t *testing.T, name string) (string, uint64) {
	t.Helper()
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, fmt.Sprintf("deptrace-test-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Emptied when its last process was reaped; the kernel updates
		// that a moment later.
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("remove cgroup %s: %v", dir, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return dir, st.Ino
}

// ownCgroupID is the cgroup v2 id of this process.
func ownCgroupID(t *testing.T) uint64 {
	t.Helper()
	root, err := kernel.CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(line, "0::"); ok {
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(root, path), &st); err != nil {
				t.Fatal(err)
			}
			return st.Ino
		}
	}
	t.Fatal("no cgroup v2 line in /proc/self/cgroup")
	return 0
}

// startTCPServer runs the echo server as a process born in cgroup dir
// (clone3 CLONE_INTO_CGROUP: every socket it makes is that cgroup's), and
// returns its pid and port once it listens.
func startTCPServer(t *testing.T, dir string) (int, int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), tcpServerEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start server in cgroup %s: %v", dir, err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("tcp server did not start: %v", err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "port ")))
	if err != nil {
		t.Fatalf("tcp server said %q", line)
	}
	return cmd.Process.Pid, port
}

// echoOnce opens a connection to port on loopback, sends a few bytes and
// reads them back, and closes it.
func echoOnce(t *testing.T, port int) {
	t.Helper()
	c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, 32, 32); err != nil {
		t.Fatal(err)
	}
}

// cgroupOf collects until both loopback flows of port were reported with
// their open (the inbound one is named where it opens), and returns their
// cgroup ids and the inbound flow's pid (0 when a flow had none).
func cgroupOf(t *testing.T, tr *tracer.Tracer, port int) (in, out uint64, inPID uint32) {
	t.Helper()
	var inSeen, outSeen bool
	take := func() {
		for _, f := range tracertest.Collect(t, tr).Flows {
			if f.Proto != tracer.ProtoTCP || f.Port != uint16(port) || f.LocalAddr != "127.0.0.1" || f.RemoteAddr != "127.0.0.1" {
				continue
			}
			switch f.Direction {
			case tracer.Inbound:
				inSeen = inSeen || f.Connections > 0
				if f.CgroupID != 0 {
					in = f.CgroupID
				}
				if f.PID != 0 {
					inPID = f.PID
				}
			case tracer.Outbound:
				outSeen = outSeen || f.Connections > 0
				if f.CgroupID != 0 {
					out = f.CgroupID
				}
			}
		}
	}
	done := func(*tracertest.Ledger) bool { return inSeen && outSeen && (in != 0 || inPID != 0) && out != 0 }
	tracertest.SettleWith(t, tr, tracertest.NewLedger(), done, take)
	return in, out, inPID
}

// A server that listened before deptrace started is named by its
// socket's cgroup (the container of a server on a node a DaemonSet rolls
// onto), and one that listens after by the process calling listen(); the
// client by its own.
func TestListenerCgroupFromBeforeAndAfterStart(t *testing.T) {
	testnet.RequireRoot(t)
	client := ownCgroupID(t)

	beforeDir, beforeID := newCgroup(t, "before")
	beforePID, beforePort := startTCPServer(t, beforeDir)
	if beforeID == client {
		t.Fatalf("the server's cgroup %d is the client's", beforeID)
	}

	tr := startTracer(t, nil)

	echoOnce(t, beforePort)
	in, out, pid := cgroupOf(t, tr, beforePort)
	if in != beforeID {
		t.Errorf("server listening since before start: inbound flow cgroup %d; want %d (%s)", in, beforeID, beforeDir)
	}
	if pid != uint32(beforePID) {
		t.Errorf("server listening since before start: inbound flow pid %d; want %d", pid, beforePID)
	}
	if out != client {
		t.Errorf("its client: outbound flow cgroup %d; want %d (this process's)", out, client)
	}

	afterDir, afterID := newCgroup(t, "after")
	_, afterPort := startTCPServer(t, afterDir)
	echoOnce(t, afterPort)
	in, out, _ = cgroupOf(t, tr, afterPort)
	if in != afterID {
		t.Errorf("server listening since after start: inbound flow cgroup %d; want %d (%s)", in, afterID, afterDir)
	}
	if out != client {
		t.Errorf("its client: outbound flow cgroup %d; want %d (this process's)", out, client)
	}
}
