package bundler

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/deptrace/deptrace/internal/netns"
)

// SeedReport says what seeding found.
type SeedReport struct {
	Namespaces int // namespaces visited
	Ports      int // listening ports written to the table
	Errors     []string
}

// Seed takes in the sockets that existed before deptrace started, in every
// network namespace (or the configured one): first the TCP listeners, into
// the port table, so that older connections get the right direction; then
// the open connections, tagged so that their bytes count from now on. Run
// it once, after Load. A socket that starts listening meanwhile is counted
// by its tracepoint and by the iterator; the iterator's count, which sees
// every current listener, wins.
func (b *Bundler) Seed() (rep SeedReport, err error) {
	// Connections are tagged late from the seed's end on, whatever it
	// managed (see Config.SeedFollows); without a seed, late tags are the
	// only way a live connection is seen.
	defer func() {
		if e := b.objs.SeedPending.Set(uint32(0)); e != nil {
			b.seedNotEnded = true // PinSeeded refuses to pin the side
			err = errors.Join(err, fmt.Errorf("set seed_pending: %w", e))
		}
	}()
	if _, ok := b.iters["seed_listeners"]; !ok {
		return rep, errors.New("no TCP socket iterator is active on this kernel")
	}
	namespaces, err := netns.List()
	if err != nil {
		return rep, err
	}
	counts := map[bundlerPortKey]uint32{}
	inodes := map[uint64]bundlerPortKey{} // listeners to name from /proc
	var wanted []netns.Namespace
	for _, ns := range namespaces {
		if b.cfg.NetNS != 0 && ns.Inode != b.cfg.NetNS {
			continue
		}
		wanted = append(wanted, ns)
	}
	rep.Namespaces = len(wanted)
	for _, ns := range wanted {
		err := netns.Do(ns.Path, func() error {
			recs, err := readIter[bundlerListenRecord](b.iters["seed_listeners"])
			for _, r := range recs {
				k := bundlerPortKey{Netns: r.Netns, Port: r.Port, Proto: r.Proto}
				counts[k]++
				if r.Ino != 0 {
					inodes[r.Ino] = k
				}
			}
			return err
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) { // gone since listed: nothing to seed
			rep.Errors = append(rep.Errors, fmt.Sprintf("listeners in netns %d: %v", ns.Inode, err))
		}
	}
	owners := socketOwners(inodes)
	ports := b.objs.Ports
	for k, n := range counts {
		var v bundlerPortValue
		_ = ports.Lookup(&k, &v) // keep the process a tracepoint recorded
		v.Refs = n
		if o, ok := owners[k]; ok && v.Pid == 0 {
			v.Pid = o.pid
			copy(v.Comm[:], o.comm)
		}
		if err := ports.Update(&k, &v, ebpf.UpdateAny); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("port table: %v", err))
			continue
		}
		rep.Ports++
	}
	if tag, ok := b.iters["tag_connections"]; ok {
		for _, ns := range wanted {
			err := netns.Do(ns.Path, func() error {
				_, err := readIter[byte](tag)
				return err
			})
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				rep.Errors = append(rep.Errors, fmt.Sprintf("connections in netns %d: %v", ns.Inode, err))
			}
		}
	}
	if len(rep.Errors) > 0 {
		return rep, fmt.Errorf("seed existing sockets: %s", strings.Join(rep.Errors, "; "))
	}
	return rep, nil
}

type owner struct {
	pid  uint32
	comm []int8
}

// socketOwners finds, for listeners that existed before deptrace started,
// the process holding each socket: the one /proc/PID/fd links to
// "socket:[INODE]" (the lowest pid when several share it, the pre-fork
// master), named by /proc/PID/comm (the thread-group leader's name).
func socketOwners(inodes map[uint64]bundlerPortKey) map[bundlerPortKey]owner {
	out := map[bundlerPortKey]owner{}
	if len(inodes) == 0 {
		return out
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, p := range procs {
		pid, err := strconv.ParseUint(p.Name(), 10, 32)
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name()))
			if err != nil {
				continue
			}
			ino, ok := strings.CutPrefix(target, "socket:[")
			if !ok {
				continue
			}
			n, err := strconv.ParseUint(strings.TrimSuffix(ino, "]"), 10, 64)
			if err != nil {
				continue
			}
			k, ok := inodes[n]
			if !ok {
				continue
			}
			if have, ok := out[k]; ok && have.pid <= uint32(pid) {
				continue
			}
			comm, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
			c := make([]int8, 0, 16)
			for _, ch := range []byte(strings.TrimSpace(string(comm))) {
				c = append(c, int8(ch))
			}
			out[k] = owner{pid: uint32(pid), comm: c}
		}
	}
	return out
}
