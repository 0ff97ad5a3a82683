package realtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcStat returns a process's state letter (R, S, T, ...) and its
// parent's pid, from /proc/PID/stat.
func ProcStat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStat(pid, string(b))
}

// parseStat reads the fields after the command name, which is in
// parentheses and may hold spaces and parentheses itself.
func parseStat(pid int, s string) (state byte, ppid int, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, s)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, s)
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err
}

// Children lists the processes whose parent is pid.
func Children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, pp, err := ProcStat(p); err == nil && pp == pid {
			out = append(out, p)
		}
	}
	return out
}

// Descendants lists pid's children, their children, and so on.
func Descendants(pid int) []int {
	var out []int
	for _, c := range Children(pid) {
		out = append(out, c)
		out = append(out, Descendants(c)...)
	}
	return out
}

// Comm is a process's name as the kernel reports it in /proc/PID/comm
// ("" when it is gone).
func Comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}
