package bundler

import (
	"errors"
	"fmt"
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
func (b *Bundler) Seed() (SeedReport, error) {
	var rep SeedReport
	if _, ok := b.iters["seed_listeners"]; !ok {
		return rep, errors.New("no TCP socket iterator is active on this kernel")
	}
	namespaces, err := netns.List()
	if err != nil {
		return rep, err
	}
	counts := map[bundlerPortKey]uint32{}
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
				counts[bundlerPortKey{Netns: r.Netns, Port: r.Port, Proto: r.Proto}]++
			}
			return err
		})
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("listeners in netns %d: %v", ns.Inode, err))
		}
	}
	ports := b.shared.Maps["ports"]
	for k, n := range counts {
		var v bundlerPortValue
		_ = ports.Lookup(&k, &v) // keep the process a tracepoint recorded
		v.Refs = n
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
			if err != nil {
				rep.Errors = append(rep.Errors, fmt.Sprintf("connections in netns %d: %v", ns.Inode, err))
			}
		}
	}
	if len(rep.Errors) > 0 {
		return rep, fmt.Errorf("seed existing sockets: %s", strings.Join(rep.Errors, "; "))
	}
	return rep, nil
}
