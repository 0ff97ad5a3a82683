package agent

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/deptrace/deptrace/internal/netns"
	"github.com/deptrace/deptrace/tracer"
)

// hostRefresh is how long a live namespace's addresses are trusted.
const hostRefresh = 30 * time.Second

// hostIDs names hosts: the root namespace is the machine (its hostname or
// --host-id); a namespace `ip netns` names is "<root>/<name>"; any other is
// "<root>/netns:<inode>.<cookie>". The inode is what lsns and
// /proc/PID/ns/net show; the cookie (Linux 5.14 and later) is there
// because the kernel gives a freed inode number to the next namespace it
// makes: on a host where containers come and go, an inode alone names one
// container after another, and the next would take the last one's
// history and addresses. Without a cookie, "<root>/netns:<inode>".
//
// The kernel's records carry the inode only: a namespace that ends, and
// whose inode a new one takes, between its last events and the drain that
// reads them, has those last events named after the new one (after an
// agent's restart that adopts a pinned kernel side, those of the whole
// time no agent ran). A namespace gone by the drain keeps, for that drain
// (its last flows), the id it was last seen with; after that, or if it was
// never seen alive, its inode alone names it.
type hostIDs struct {
	rootNS uint32
	rootID string
	// cookies: the kernel gives namespace cookies (5.14 and later), so
	// a live namespace whose cookie could not be read is a failed read.
	cookies bool
	mu      sync.Mutex
	cache   map[uint32]*hostInfo
	// drain counts drains (nextDrain): a name is checked once a drain,
	// however many flows, metrics and logs ask for it.
	drain uint64
	// list holds the namespaces listed in drain listedIn: one walk of
	// /proc a drain, however many namespaces it names.
	list       []netns.Namespace
	listedIn   uint64
	relistedIn uint64 // the drain that listed them again for one not there
}

type hostInfo struct {
	ID, Name string
	// Addrs are the addresses read now from the namespace's interfaces,
	// none once it is gone: a batch says the host held them when it was
	// made.
	Addrs []string
	read  time.Time
	// from is the nsfs path the namespace was read through, and
	// fromStart the start time of the process whose path it is (0 for a
	// bind mount): while both still hold, a live process or bind mount
	// keeps the namespace, so no other can have its inode.
	from      string
	fromStart uint64
	// checkedIn is the drain in which the name was last found to hold.
	checkedIn uint64
	// goneIn is the first drain in which the namespace was found gone
	// (0: it was not).
	goneIn uint64
}

// CheckHostID says why id cannot name a host (--host-id; "" is the
// hostname): a host's namespaces are named "<id>/<netns>", and ids are
// typed in queries and URLs, shown in tables and sent as metric labels.
func CheckHostID(id string) error {
	switch {
	case len(id) > 253:
		return fmt.Errorf("%d bytes long: allowed up to 253, as a DNS name", len(id))
	case strings.Contains(id, "/"):
		return errors.New("contains /, which separates a host from its namespaces (host/netns): allowed letters, digits and punctuation other than /")
	case !utf8.ValidString(id):
		return errors.New("not UTF-8: allowed letters, digits and punctuation other than /")
	case strings.IndexFunc(id, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return errors.New("contains a space or control character: allowed letters, digits and punctuation other than /")
	}
	return nil
}

func newHostIDs(rootID string) (*hostIDs, error) {
	self, err := netns.Self()
	if err != nil {
		return nil, err
	}
	if rootID == "" {
		if rootID, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("hostname: %w", err)
		}
	}
	_, err = netns.Cookie()
	return &hostIDs{rootNS: self, rootID: rootID, cookies: err == nil, cache: map[uint32]*hostInfo{}, drain: 1}, nil
}

// NamespaceHostID is the host id of the network namespace with inode ino
// and cookie (0: none known) on the machine rootID, when `ip netns` does
// not name it.
func NamespaceHostID(rootID string, ino uint32, cookie uint64) string {
	if cookie == 0 {
		return fmt.Sprintf("%s/netns:%d", rootID, ino)
	}
	return fmt.Sprintf("%s/netns:%d.%d", rootID, ino, cookie)
}

// nextDrain starts a drain's naming. Every namespace named before is
// checked once: one that neither what it was read through nor this
// drain's listing holds any more is gone from this drain, which reads its
// last flows and names them after it; at the next drain it is forgotten,
// and its inode names whatever namespace comes next. Without the sweep, a
// namespace that ended idle would hand its id, hours later, to a one-shot
// container on its inode.
func (h *hostIDs) nextDrain() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.drain++
	for ino, hi := range h.cache {
		switch {
		case ino == h.rootNS:
		case hi.goneIn != 0:
			delete(h.cache, ino) // gone since an earlier drain
		case h.holds(ino, hi):
			if h.fresh(ino, hi) {
				hi.checkedIn = h.drain
			}
		default:
			if ns, listed := h.find(ino); ns == nil && listed {
				hi.goneIn, hi.checkedIn, hi.Addrs = h.drain, h.drain, nil
			}
			// Else held by another process now, or not listed: the
			// next host() reads it again.
		}
	}
}

// nameInterval names the namespaces of iv's records, each once, before
// anything else asks (the metrics, under their lock).
func (h *hostIDs) nameInterval(iv *tracer.Interval) {
	seen := map[uint32]bool{}
	name := func(ino uint32) {
		if !seen[ino] {
			seen[ino] = true
			h.host(ino)
		}
	}
	for i := range iv.Flows {
		name(flowNetNS(iv.Flows[i], h.rootNS))
	}
	for i := range iv.Listeners {
		name(iv.Listeners[i].NetNS)
	}
	for i := range iv.DNS {
		name(iv.DNS[i].NetNS)
	}
}

func (h *hostIDs) host(ino uint32) hostInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.cache[ino]
	if old != nil && h.still(ino, old) {
		return *old
	}
	// lastID keeps the id a namespace seen alive had (not a gone one's:
	// the inode may be another's now).
	lastID := func(hi *hostInfo) {
		if old != nil && old.goneIn == 0 {
			hi.ID = old.ID
		}
	}
	hi := &hostInfo{read: time.Now(), checkedIn: h.drain}
	switch names := netns.Names(); {
	case ino == h.rootNS:
		hi.ID, hi.Name = h.rootID, h.rootID
		hi.Addrs = localAddrs()
	case names[ino] != "":
		hi.ID, hi.Name = h.rootID+"/"+names[ino], names[ino]
		hi.from = netns.NamedDir + "/" + names[ino]
		hi.Addrs, _, _ = readNamespace(hi.from, ino)
	default:
		hi.ID = NamespaceHostID(h.rootID, ino, 0)
		ns, listed := h.find(ino)
		switch {
		case ns != nil:
			hi.from, hi.fromStart = ns.Path, processStart(ns.Path)
			addrs, cookie, read := readNamespace(ns.Path, ino)
			switch {
			case read && cookie != 0:
				hi.ID, hi.Addrs = NamespaceHostID(h.rootID, ino, cookie), addrs
			case read && !h.cookies: // before 5.14: the inode alone
				hi.Addrs = addrs
			default:
				// Live but not read (its process exited meanwhile, or
				// entered another namespace): the id it had, read
				// again at the next drain.
				lastID(hi)
				hi.read = time.Time{}
			}
		case !listed:
			lastID(hi)
			hi.read = time.Time{}
		default:
			// Gone: ended since this drain's sweep (its own last flows),
			// or never seen alive (a one-shot container: its inode
			// alone names it).
			hi.goneIn = h.drain
			lastID(hi)
		}
	}
	hi.Name = cmp.Or(hi.Name, hi.ID)
	h.cache[ino] = hi
	return *hi
}

// find is the namespace with inode ino in this drain's listing of them,
// listed again once a drain for one that is not there (made since);
// listed is false when they cannot be listed.
func (h *hostIDs) find(ino uint32) (ns *netns.Namespace, listed bool) {
	lookup := func() *netns.Namespace {
		for i := range h.list {
			if h.list[i].Inode == ino {
				return &h.list[i]
			}
		}
		return nil
	}
	if h.listedIn == h.drain {
		if ns := lookup(); ns != nil || h.relistedIn == h.drain {
			return ns, true
		}
		h.relistedIn = h.drain
	}
	list, err := netns.List()
	if err != nil {
		return nil, false
	}
	h.list, h.listedIn = list, h.drain
	return lookup(), true
}

// still reports whether a cached name still holds: a gone namespace's in
// the drain that found it gone (older ones are forgotten by nextDrain); a
// live one's, checked once a drain, while its addresses are fresh and
// what it was read through still opens it.
func (h *hostIDs) still(ino uint32, hi *hostInfo) bool {
	switch {
	case hi.goneIn != 0 || hi.checkedIn == h.drain:
		return true
	case !h.fresh(ino, hi):
		return false
	case ino != h.rootNS && !h.holds(ino, hi):
		return false
	}
	hi.checkedIn = h.drain
	return true
}

// fresh reports whether hi's addresses need no new read: read less than
// hostRefresh ago, and not before the namespace had an address (a
// container's network is attached after its namespace is made).
func (h *hostIDs) fresh(ino uint32, hi *hostInfo) bool {
	return time.Since(hi.read) < hostRefresh && (ino == h.rootNS || hasAddress(hi.Addrs))
}

// holds reports whether what hi was read through still opens namespace
// ino: the bind mount, or the same process (by its start time: a PID
// given to another changes it). While it does, no other namespace can
// have the inode.
func (h *hostIDs) holds(ino uint32, hi *hostInfo) bool {
	got, err := netns.Inode(hi.from)
	return err == nil && got == ino && hi.fromStart == processStart(hi.from)
}

// hasAddress reports whether addrs hold an address other than loopback.
func hasAddress(addrs []string) bool {
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil && !ip.IsLoopback() {
			return true
		}
	}
	return false
}

// readNamespace reads the addresses and cookie (0 where the kernel has
// none) of the namespace at path, which must be ino's: read is false when
// it could not be entered or is another by now (its process entered
// another namespace, or its PID was given to another process).
func readNamespace(path string, ino uint32) (addrs []string, cookie uint64, read bool) {
	_ = netns.Do(path, func() error {
		if got, err := netns.Inode("/proc/thread-self/ns/net"); err != nil || got != ino {
			return nil
		}
		addrs, read = localAddrs(), true
		cookie, _ = netns.Cookie() // before 5.14: the inode alone
		return nil
	})
	return addrs, cookie, read
}

// processStart is the start time (in clock ticks since boot) of the
// process whose /proc/PID/ns/net path is given, 0 for any other path or
// a process that is gone: a PID given to another process changes it.
func processStart(path string) uint64 {
	rest, ok := strings.CutPrefix(path, "/proc/")
	if !ok {
		return 0
	}
	pid, _, _ := strings.Cut(rest, "/")
	if _, err := strconv.Atoi(pid); err != nil {
		return 0
	}
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces and ")": the
	// fields start after the last ")". starttime is field 22, the 20th
	// after it.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 {
		return 0
	}
	start, _ := strconv.ParseUint(fields[19], 10, 64)
	return start
}

func localAddrs() []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range addrs {
		// Link-local addresses repeat on every host: they name nothing.
		if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p.Addr().Unmap().String())
		}
	}
	return out
}
