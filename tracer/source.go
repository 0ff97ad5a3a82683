package tracer

import (
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/deptrace/deptrace/internal/netns"
)

// sourceCache answers "which local address does namespace N send from to
// reach R" with the namespace's own routing table, as the kernel does for
// each datagram of an unconnected UDP socket bound to a wildcard. Answers
// are kept for a minute so a flow costs one route lookup per minute.
type sourceCache struct {
	entries map[sourceKey]sourceEntry
	now     func() time.Time
}

type sourceKey struct {
	netns  uint32
	remote netip.Addr
}

type sourceEntry struct {
	addr    netip.Addr
	ok      bool
	expires time.Time
}

const (
	sourceTTL        = time.Minute
	sourceCacheLimit = 1 << 14
)

func newSourceCache() *sourceCache {
	return &sourceCache{entries: map[sourceKey]sourceEntry{}, now: time.Now}
}

func (c *sourceCache) source(ns uint32, remote netip.Addr) (netip.Addr, bool) {
	k := sourceKey{ns, remote}
	now := c.now()
	if e, ok := c.entries[k]; ok && now.Before(e.expires) {
		return e.addr, e.ok
	}
	addr, ok := routeSource(ns, remote)
	if len(c.entries) >= sourceCacheLimit {
		clear(c.entries) // bounded memory beats a perfect cache
	}
	c.entries[k] = sourceEntry{addr, ok, now.Add(sourceTTL)}
	return addr, ok
}

// routeSource asks the routing table of namespace ns for the source
// address towards remote.
func routeSource(ns uint32, remote netip.Addr) (netip.Addr, bool) {
	path := ""
	if self, err := netns.Self(); err == nil && self == ns {
		path = "/proc/self/ns/net"
	} else {
		all, err := netns.List()
		if err != nil {
			return netip.Addr{}, false
		}
		for _, n := range all {
			if n.Inode == ns {
				path = n.Path
				break
			}
		}
	}
	if path == "" {
		return netip.Addr{}, false
	}
	var src netip.Addr
	err := netns.Do(path, func() error {
		routes, err := netlink.RouteGet(net.IP(remote.AsSlice()))
		if err != nil {
			return err
		}
		for _, r := range routes {
			if a, ok := netip.AddrFromSlice(r.Src); ok && a.IsValid() && !a.IsUnspecified() {
				src = a.Unmap()
				return nil
			}
		}
		return nil
	})
	return src, err == nil && src.IsValid()
}
