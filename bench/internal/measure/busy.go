package measure

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// busyClock is one reading of the machine's CPU time spent outside idle;
// two readings give the busy CPU time between them (busySince).
//
// /proc/stat's busy time is tick-sampled on kernels built with
// CONFIG_TICK_CPU_ACCOUNTING (Debian's): each tick charges a whole tick
// (4 ms at HZ 250) to what the CPU was doing at that instant, so a load
// whose work comes in short bursts is charged by chance, and with a bias
// when its bursts keep time with the tick. The cpuidle driver's residency
// counters (/sys/devices/system/cpu/cpuN/cpuidle/stateK/time, in µs) sum
// the time each CPU spent in an idle state, clocked at every entry and
// exit: busy = CPUs × wall time − idle time − steal (a virtual CPU's time
// taken by the host is in no idle state; /proc/stat counts it apart), with
// no sampling. They are used when every online CPU has them, else
// /proc/stat's ticks. (Steal while a virtual CPU polls in its POLL state
// is subtracted twice: small, and only in a VM.)
type busyClock struct {
	// mono is CLOCK_MONOTONIC; the kernel clocks residency with
	// local_clock, which runs at the same rate on a TSC.
	mono   time.Duration
	online string        // the online CPU list read
	cpus   int           // online CPUs whose idle residency is summed; 0: none read
	idle   time.Duration // their summed idle residency
	ticks  time.Duration // /proc/stat's busy time (user nice system irq softirq)
	steal  time.Duration // /proc/stat's steal time
}

// Busy sources, as errors name them.
const (
	busyFromIdleStates = "cpuidle residency"
	busyFromTicks      = "/proc/stat"
)

// describeBusySource is a source's name as WritePairedMarkdown prints it.
func describeBusySource(src string) string {
	switch src {
	case busyFromIdleStates:
		return "the cpuidle residency counters (busy = CPUs × wall time − time in idle states − steal)"
	case busyFromTicks:
		return "/proc/stat's ticks (idle, iowait and steal excluded)"
	}
	return src
}

func readBusyClock() (busyClock, error) {
	var c busyClock
	var err error
	if c.ticks, c.steal, err = statBusy(); err != nil {
		return c, err
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // CLOCK_MONOTONIC is always there
	c.mono = time.Duration(ts.Nano())
	c.online, c.cpus, c.idle = idleResidencyPinned("/sys/devices/system/cpu")
	return c, nil
}

// idleResidencyPinned reads each CPU's idle residency from this thread
// moved onto that CPU. A CPU's counters grow only when it leaves an idle
// state, so read from another CPU an idle period in progress is missed:
// without perf waking the CPUs, that was up to 9 % of a 5 s load's busy
// time on this project's machine. Read on the CPU itself, the period has
// just ended. The reads run on a thread locked to a goroutine of their
// own, which gives the thread its affinity back and ends without
// unlocking it: Go then ends the thread (or parks it for good, if it is
// the main thread), so even if giving the affinity back failed, no other
// goroutine (nor a process started from one) runs on the last CPU only.
func idleResidencyPinned(sys string) (online string, cpus int, idle time.Duration) {
	type reading struct {
		online string
		cpus   int
		idle   time.Duration
	}
	done := make(chan reading, 1)
	go func() {
		runtime.LockOSThread() // never unlocked (above)
		var orig unix.CPUSet
		if err := unix.SchedGetaffinity(0, &orig); err != nil {
			done <- reading{}
			return
		}
		defer func() { _ = unix.SchedSetaffinity(0, &orig) }()
		var r reading
		r.online, r.cpus, r.idle = idleResidency(sys, func(cpu int) error {
			var on unix.CPUSet
			on.Set(cpu)
			return unix.SchedSetaffinity(0, &on)
		})
		done <- r
	}()
	r := <-done
	return r.online, r.cpus, r.idle
}

// busySince is the busy CPU time from a to c, and the source it came
// from: the idle residency when both readings have it for the same CPUs
// and it lies between none and all of them, else /proc/stat's ticks.
func (c busyClock) busySince(a busyClock) (time.Duration, string) {
	if c.cpus > 0 && c.cpus == a.cpus && c.online == a.online {
		all := time.Duration(c.cpus) * (c.mono - a.mono)
		if busy := all - (c.idle - a.idle) - (c.steal - a.steal); busy >= 0 && busy <= all {
			return busy, busyFromIdleStates
		}
	}
	return c.ticks - a.ticks, busyFromTicks
}

// idleResidency sums the idle-state residency of every online CPU under
// sys (/sys/devices/system/cpu), each read after pin(cpu); cpus is 0 when
// any of them has none (no cpuidle driver: a CPU left out would count as
// busy all the time) or cannot be pinned to.
func idleResidency(sys string, pin func(cpu int) error) (online string, cpus int, idle time.Duration) {
	list, err := os.ReadFile(filepath.Join(sys, "online"))
	if err != nil {
		return "", 0, 0
	}
	online = strings.TrimSpace(string(list))
	ids, err := parseCPUList(online)
	if err != nil || len(ids) == 0 {
		return "", 0, 0
	}
	for _, id := range ids {
		if pin(id) != nil {
			return "", 0, 0
		}
		states, _ := filepath.Glob(filepath.Join(sys, "cpu"+strconv.Itoa(id), "cpuidle", "state*", "time"))
		if len(states) == 0 {
			return "", 0, 0
		}
		for _, s := range states {
			b, err := os.ReadFile(s)
			if err != nil {
				return "", 0, 0
			}
			us, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				return "", 0, 0
			}
			idle += time.Duration(us) * time.Microsecond
		}
	}
	return online, len(ids), idle
}

// parseCPUList parses the kernel's CPU list format ("0-3,5,7-8").
func parseCPUList(s string) ([]int, error) {
	var ids []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("CPU list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("CPU list %q: bad range %q", s, part)
			}
		}
		for i := a; i <= b; i++ {
			ids = append(ids, i)
		}
	}
	return ids, nil
}

// statBusy is the CPU time all CPUs spent not idle since boot, and their
// steal time, from the first line of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is already inside user).
func statBusy() (busy, steal time.Duration, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("read /proc/stat: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	var ticks [8]uint64
	for i := range ticks {
		if ticks[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("parse /proc/stat %q: %w", line, err)
		}
	}
	// USER_HZ, fixed by the kernel ABI; busy: user nice system irq softirq.
	const userHz = 100
	busy = time.Duration(ticks[0]+ticks[1]+ticks[2]+ticks[5]+ticks[6]) * time.Second / userHz
	return busy, time.Duration(ticks[7]) * time.Second / userHz, nil
}
