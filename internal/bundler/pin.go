package bundler

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Pinning keeps the kernel side alive across agent restarts: maps and links
// pinned under PinPath stay attached and counting after the process that
// loaded them exits (or is killed); the next agent adopts them and drains
// what was counted meanwhile. Layout of PinPath:
//
//	meta              entry 0: the object's SHA-256: adopt only the very
//	                  same code; entry 1: flowLayout, which says whether a
//	                  replaced side's counts can be salvaged
//	drain             the drain record: the side's identity, its last
//	                  interval's generation, whether that one is committed
//	map_<name>        every map the programs write (flows, flows_a, flows_b,
//	                  the flow spill, the interval programs count, ...)
//	link_<program>    every attached tracepoint and cgroup program
//
// Iterator programs are not pinned: each agent loads its own against the
// pinned maps.

// pinnedMaps are the maps whose contents must survive a restart.
// The DNS watcher's program arrays and resolver notes are among them: an
// adopted side's send and receive programs tail-call through its own
// arrays, and its sendmsg programs note resolvers in its own storage.
var pinnedMaps = []string{"flows", "ports", "socks", "stats", "unix_paths", "spill", "interval_now", "spill_used", "spill_claims", "flow_cache", "dns_send_calls", "dns_recv_calls", "dns_dests"}

// AdoptReport says what Load found under the pin path.
type AdoptReport struct {
	// Adopted is true when a running kernel side was taken over.
	Adopted bool
	// Replaced says why a pinned kernel side was not adopted but removed
	// ("" when there was none).
	Replaced string
	// Salvaged are the counts read from a replaced kernel side whose
	// flow layout was still readable, counted since its last collected
	// interval (reported with the first interval of this side);
	// SalvagedPending those of the interval its process had collected but
	// not committed (reported first, as that interval: see salvage).
	// Unreadable counts entries that could not be read.
	Salvaged        []Entry
	SalvagedPending []Entry
	Unreadable      int
	// MountedBPFFS is true when Load had to mount bpffs at the pin path's
	// parent (a fresh machine may have a plain directory there).
	MountedBPFFS bool
}

func binarySize[T any]() int {
	var t T
	return binary.Size(t)
}

// objectHash identifies a kernel side: the object's code and the
// configuration baked into it. A pinned side is adopted only when both
// are the same (another --netns is another kernel side).
func objectHash(cfg Config) [32]byte {
	h := sha256.New()
	h.Write(_BundlerBytes)
	// Which hooks are attached is part of a side: a side pinned with the
	// syscall tracepoint must not be adopted by an agent told to leave it
	// off (its pinned link would keep slowing every system call).
	fmt.Fprintf(h, "netns=%d flows=%d ports=%d syscalls=%t marks=%t", cfg.NetNS, cfg.FlowMapSize, cfg.PortMapSize, cfg.SyscallTracepoints, recTaskMarks())
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// bpffsHome is where bpffs is usually mounted, and the only place
// deptrace mounts it.
const bpffsHome = "/sys/fs/bpf"

// CheckPinPath says why pinPath cannot hold a pinned kernel side, without
// creating or mounting anything: it must be absolute, and its nearest
// existing ancestor on bpffs, or its parent bpffs's usual place, where the
// agent mounts one. The agent asks before it opens its store.
func CheckPinPath(pinPath string) error {
	if !filepath.IsAbs(pinPath) {
		return errors.New("not an absolute path")
	}
	pinPath = filepath.Clean(pinPath)
	parent := filepath.Dir(pinPath)
	if parent == "/" {
		return errors.New("not under a bpffs mount")
	}
	if parent == bpffsHome {
		return nil // on bpffs, or where ensureBPFFS mounts it
	}
	for dir := parent; ; dir = filepath.Dir(dir) {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if errors.Is(err, unix.ENOENT) && dir != "/" {
			continue // created by the agent, on its ancestor's file system
		}
		if err != nil {
			return fmt.Errorf("statfs %s: %w", dir, err)
		}
		if st.Type != unix.BPF_FS_MAGIC {
			return fmt.Errorf("not on bpffs (%s is not)", dir)
		}
		return nil
	}
}

// ensureBPFFS mounts bpffs on the pin path's parent when it is not one,
// but only at bpffs's usual place: mounting over any other directory could
// hide what it holds. CheckPinPath first: nothing is created off bpffs.
func ensureBPFFS(pinPath string) (mounted bool, err error) {
	if err := CheckPinPath(pinPath); err != nil {
		return false, fmt.Errorf("pin path %s: %w: choose a directory under a bpffs mount such as %s", pinPath, err, bpffsHome)
	}
	dir := filepath.Dir(filepath.Clean(pinPath))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("create %s: %w", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return false, nil
	}
	if dir != bpffsHome {
		return false, fmt.Errorf("pin path %s: not on bpffs (%s is not): choose a directory under a bpffs mount such as %s", pinPath, dir, bpffsHome)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return false, fmt.Errorf("%s is not a bpffs and mounting one there failed: %w", dir, err)
	}
	return true, nil
}

// lockDir holds the agents' lock files: bpffs holds BPF objects only.
const lockDir = "/run/deptrace"

// lockName is the lock file of a pin path: the cleaned path escaped as
// systemd escapes a path for a unit name (systemd-escape --path), so no
// two paths share a lock (/a/b is a-b, /a-b is a\x2db) and /sys/fs/bpf//x
// is /sys/fs/bpf/x.
func lockName(pinPath string) string {
	p := strings.Trim(filepath.Clean(pinPath), "/")
	if p == "" {
		return filepath.Join(lockDir, "-.lock")
	}
	plain := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == ':' || c == '_' || c == '.'
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			b.WriteByte('-')
		case c == '.' && i == 0, !plain(c):
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteByte(c)
		}
	}
	return filepath.Join(lockDir, b.String()+".lock")
}

// agentLock makes its process the only one owning a pin path.
type agentLock struct {
	f      *os.File
	name   string
	legacy *os.File // the lock of deptrace before lockName (legacyLockName), or nil
}

// legacyLockName is the lock file deptrace used before lockName for the
// default pin path, the one packaged agents and images use. An agent of
// that version, during an upgrade, locks only it: so it is locked too, and
// never removed (such an agent does not check that the file it locked is
// still the one at the name). Other pin paths are left to lockName: the
// old names flattened them (/a/b and /a_b shared one).
const legacyLockName = lockDir + "/sys_fs_bpf_deptrace.lock"

// lockLegacy takes the legacy lock where pinPath is the default pin path
// (nil otherwise).
func lockLegacy(pinPath string) (*os.File, error) {
	if filepath.Clean(pinPath) != bpffsHome+"/deptrace" {
		return nil, nil
	}
	f, err := os.OpenFile(legacyLockName, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", legacyLockName, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close() // the flock's error is the one to report
		return nil, ownedError(legacyLockName, pinPath, ", an earlier version")
	}
	writeOwner(f)
	return f, nil
}

// ownedError is the error of an agent that found the lock at name held:
// it names the holder's pid, which writeOwner left there.
func ownedError(name, pinPath, which string) error {
	owner, _ := os.ReadFile(name)
	return fmt.Errorf("another deptrace (pid %s%s) owns the kernel side at %s: stop it first", strings.TrimSpace(string(owner)), which, pinPath)
}

// writeOwner writes this process's pid in a lock it holds. The pid is
// only for the message of an agent that finds the lock taken; the flock
// is what excludes it.
func writeOwner(f *os.File) {
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
}

// lockAgent makes this process the only one owning pinPath: a second agent
// gets an error naming the first one's pid. The lock is a flock, so it
// dies with the process; release removes its file.
func lockAgent(pinPath string) (*agentLock, error) {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", lockDir, err)
	}
	name := lockName(pinPath)
	// A lock is ours only if its file is still the one at name: a holder
	// removes the file as it releases the lock, so a flock won on a file
	// just removed would exclude no one. Another try opens the new file.
	for try := 0; ; try++ {
		f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock %s: %w", name, err)
		}
		ours, err := flockOpened(f, name)
		if err != nil {
			_ = f.Close() // the flock's error is the one to report
			return nil, ownedError(name, pinPath, "")
		}
		if ours {
			writeOwner(f)
			l := &agentLock{f: f, name: name}
			if l.legacy, err = lockLegacy(pinPath); err != nil {
				l.release()
				return nil, err
			}
			return l, nil
		}
		_ = f.Close() // removed under us: not a lock
		if try == 100 {
			return nil, fmt.Errorf("lock %s: removed under this agent 100 times in a row: another agent keeps starting and stopping", name)
		}
	}
}

// flockOpened takes the flock of f, opened at name, without waiting: an
// error when another process holds it; false when f is no longer the file
// at name (its holder removed it as it released it), so its flock
// excludes no one.
func flockOpened(f *os.File, name string) (ours bool, err error) {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return false, err
	}
	var held, named unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &held); err != nil {
		return false, nil
	}
	if err := unix.Stat(name, &named); err != nil {
		return false, nil
	}
	return held.Ino == named.Ino && held.Dev == named.Dev, nil
}

// release removes the lock file, then unlocks: an agent that opened the
// file before the removal finds, once it wins the flock, that the file is
// no longer the one at the name, and tries again.
func (l *agentLock) release() {
	if l == nil {
		return
	}
	// The legacy lock first: an agent that wins the new lock in between
	// must not find the legacy one still held and blame an earlier version.
	if l.legacy != nil {
		_ = l.legacy.Close() // kept: see legacyLockName
	}
	_ = os.Remove(l.name) // a file left behind only costs a name in /run
	_ = l.f.Close()       // releasing the flock: nothing is written
}

// PinSeeded pins a side that Load left unpinned for its seed
// (Config.SeedFollows with a PinPath), after Seed; a no-op otherwise. On
// error the side is closed, as Load closes one it could not pin.
func (b *Bundler) PinSeeded() error {
	if !b.pinAfterSeed {
		return nil
	}
	b.pinAfterSeed = false
	if b.shared == nil {
		return errors.New("pin the kernel side: it was closed")
	}
	err := b.pin()
	if err == nil && b.seedNotEnded {
		// A pinned side keeps its seed_pending for every adopter.
		err = errors.New("the start-up seed could not be ended (seed_pending still set)")
	}
	if err != nil {
		// Half a pinned side must not stay behind to be adopted.
		b.pinned = true
		_ = b.Close() // the pin's error is the one to report
		return fmt.Errorf("pin the kernel side at %s: %w", b.cfg.PinPath, err)
	}
	return nil
}

// pin writes every map and link of a freshly loaded kernel side.
func (b *Bundler) pin() error {
	if err := os.MkdirAll(b.cfg.PinPath, 0o700); err != nil {
		return err
	}
	meta, err := ebpf.NewMap(&ebpf.MapSpec{Name: "deptrace_meta", Type: ebpf.Array, KeySize: 4, ValueSize: 32, MaxEntries: 2})
	if err != nil {
		return fmt.Errorf("create meta map: %w", err)
	}
	defer meta.Close()
	h := objectHash(b.cfg)
	if err := meta.Put(uint32(0), h[:]); err != nil {
		return fmt.Errorf("write meta map: %w", err)
	}
	var layout [32]byte
	binary.NativeEndian.PutUint32(layout[:], flowLayout)
	if err := meta.Put(uint32(1), layout[:]); err != nil {
		return fmt.Errorf("write meta map: %w", err)
	}
	if err := meta.Pin(filepath.Join(b.cfg.PinPath, "meta")); err != nil {
		return fmt.Errorf("pin meta map: %w", err)
	}
	if err := b.newDrainRecord(0); err != nil {
		return err
	}
	for _, name := range pinnedMaps {
		if err := b.shared.Maps[name].Pin(filepath.Join(b.cfg.PinPath, "map_"+name)); err != nil {
			return fmt.Errorf("pin map %s: %w", name, err)
		}
	}
	for i, m := range b.inner {
		if err := m.Pin(filepath.Join(b.cfg.PinPath, fmt.Sprintf("map_flows_%c", 'a'+i))); err != nil {
			return fmt.Errorf("pin bundled-flow map: %w", err)
		}
	}
	for prog, l := range b.linkOf {
		if err := l.Pin(filepath.Join(b.cfg.PinPath, "link_"+prog)); err != nil {
			return fmt.Errorf("pin link of %s: %w", prog, err)
		}
	}
	b.pinned = true
	return nil
}

// pinnedSide is what a pin path holds.
// flowLayout numbers the layout of the flow key, the flow value and the
// spill and cache slot as the kernel side writes them. Change it with any
// of them: a replaced side's counts are salvaged only when its layout is
// this one (TestFlowLayoutFingerprint fails until it is changed). Sides
// pinned before the number existed have none (0): never read. 5: the flow
// maps hold one value per flow, not one per CPU (the same value layout).
const flowLayout = 5

type pinnedSide struct {
	hash   []byte
	layout uint32    // flowLayout of the side's build; 0: unknown
	drain  *ebpf.Map // nil when pinned by a deptrace without drain records
	maps   map[string]*ebpf.Map
	inner  [2]*ebpf.Map
	links  map[string]link.Link
}

func (p *pinnedSide) close() {
	if p.drain != nil {
		p.drain.Close()
	}
	for _, m := range p.maps {
		m.Close()
	}
	for _, m := range p.inner {
		if m != nil {
			m.Close()
		}
	}
	for _, l := range p.links {
		l.Close()
	}
}

// loadPinned opens what is pinned at path; ok is false when nothing is.
func loadPinned(path string) (p *pinnedSide, ok bool, err error) {
	meta, err := ebpf.LoadPinnedMap(filepath.Join(path, "meta"), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, fmt.Errorf("open pinned meta map: %w", err)
	}
	defer meta.Close()
	p = &pinnedSide{maps: map[string]*ebpf.Map{}, links: map[string]link.Link{}}
	var h [32]byte
	if err := meta.Lookup(uint32(0), &h); err == nil {
		p.hash = h[:]
	}
	var layout [32]byte
	if err := meta.Lookup(uint32(1), &layout); err == nil {
		p.layout = binary.NativeEndian.Uint32(layout[:])
	}
	for _, name := range pinnedMaps {
		if m, err := ebpf.LoadPinnedMap(filepath.Join(path, "map_"+name), nil); err == nil {
			p.maps[name] = m
		}
	}
	if m, err := ebpf.LoadPinnedMap(filepath.Join(path, drainPin), nil); err == nil {
		p.drain = m
	}
	for i := range p.inner {
		if m, err := ebpf.LoadPinnedMap(filepath.Join(path, fmt.Sprintf("map_flows_%c", 'a'+i)), nil); err == nil {
			p.inner[i] = m
		}
	}
	entries, _ := os.ReadDir(path)
	for _, e := range entries {
		if prog, ok := strings.CutPrefix(e.Name(), "link_"); ok {
			if l, err := link.LoadPinnedLink(filepath.Join(path, e.Name()), nil); err == nil {
				p.links[prog] = l
			}
		}
	}
	return p, true, nil
}

// compatible reports why the pinned side cannot be adopted, or "".
func (p *pinnedSide) compatible(spec *ebpf.CollectionSpec, flows *ebpf.MapSpec, cfg Config) string {
	if h := objectHash(cfg); string(p.hash) != string(h[:]) {
		return "it was loaded by another deptrace build or with other --netns or map sizes (another --flow-map-size?)"
	}
	for _, name := range pinnedMaps {
		m, ok := p.maps[name]
		if !ok {
			return "map " + name + " is missing"
		}
		s := spec.Maps[name].Copy()
		switch name {
		case "ports":
			s.MaxEntries = cfg.PortMapSize
		case "spill":
			s.MaxEntries = 2 * SpillSlots(cfg.FlowMapSize)
		}
		if err := s.Compatible(m); err != nil {
			return fmt.Sprintf("map %s differs: %v", name, err)
		}
	}
	inner := flows.InnerMap.Copy()
	inner.MaxEntries = cfg.FlowMapSize
	for _, m := range p.inner {
		if m == nil {
			return "a bundled-flow map is missing"
		}
		if err := inner.Compatible(m); err != nil {
			return fmt.Sprintf("bundled-flow map differs (another --flow-map-size?): %v", err)
		}
	}
	if _, ok := p.links["on_tcp_state"]; !ok {
		return "its TCP tracepoint is not attached"
	}
	// A side pinned part-way (killed while pinning) may lack copies: its
	// runs skipped for recursion would be lost unseen.
	for _, def := range hookDefs {
		if _, ok := p.links[def.program]; !ok {
			continue
		}
		for _, name := range copyNames(def, recTaskMarks()) {
			if _, ok := p.links[name]; !ok {
				return "the copies of " + def.program + " are not all attached"
			}
		}
	}
	if d := p.drain; d != nil && (d.Type() != ebpf.Array || d.KeySize() != 4 || d.ValueSize() != uint32(binarySize[drainRecord]()) || d.MaxEntries() != 1) {
		return "its drain record has another layout"
	}
	return ""
}

// drainPin is the pinned drain record's name under the pin path.
const drainPin = "drain"

// drainRecord is a pinned side's drain state: one entry of an array map
// that Go creates and pins next to the flow maps (no program reads it).
// Side and Gen name every interval (Interval.BatchID); Pending says the
// idle flow map holds interval Gen, read or not but not committed: the
// next Collect, in this process or the next, returns it again.
type drainRecord struct {
	Side    [16]byte
	Gen     uint64
	Pending uint32
	Pad     uint32
}

func (b *Bundler) drainRecordPath() string { return filepath.Join(b.cfg.PinPath, drainPin) }

// newDrainRecord creates and pins the drain record of a side with a new
// identity, whose last interval collected is gen, committed.
func (b *Bundler) newDrainRecord(gen uint64) error {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "deptrace_drain", Type: ebpf.Array, KeySize: 4,
		ValueSize: uint32(binarySize[drainRecord]()), MaxEntries: 1})
	if err != nil {
		return fmt.Errorf("create drain record: %w", err)
	}
	defer m.Close()
	var side [16]byte
	rand.Read(side[:]) // never fails (crypto/rand crashes the program instead)
	rec := drainRecord{Side: side, Gen: gen}
	if err := m.Put(uint32(0), rec); err != nil {
		return fmt.Errorf("write drain record: %w", err)
	}
	if err := m.Pin(b.drainRecordPath()); err != nil {
		return fmt.Errorf("pin drain record: %w", err)
	}
	b.setDrainState(rec)
	return nil
}

func (b *Bundler) setDrainState(rec drainRecord) {
	b.drain.side, b.drain.gen, b.drain.loaded = rec.Side, rec.Gen, true
	b.drain.pending = nil
	if rec.Pending != 0 {
		b.drain.pending = &pendingDrain{gen: rec.Gen, idx: int(rec.Gen & 1)}
	}
}

// loadDrainState learns the side's identity and generation once: from the
// pinned drain record, or new for an unpinned side. An adopted side whose
// record says pending has that interval collected again first.
func (b *Bundler) loadDrainState() error {
	if b.drain.loaded {
		return nil
	}
	if !b.pinned {
		rand.Read(b.drain.side[:])
		b.drain.loaded = true
		return nil
	}
	now, err := b.intervalNow()
	if err != nil {
		return err
	}
	m, err := ebpf.LoadPinnedMap(b.drainRecordPath(), nil)
	if errors.Is(err, os.ErrNotExist) {
		// Its record lost (removed by hand: this build pins it before
		// the maps): a new identity, from the interval programs count.
		// The idle map's interval may have been stored, and under a new
		// identity a store could not tell it from a new one: it is not
		// collected (lost, if it was not stored).
		if err := b.newDrainRecord(now - 1); err != nil {
			return err
		}
		return b.discardHalves(int((now - 1) & 1))
	}
	if err != nil {
		return fmt.Errorf("open the pinned drain record: %w", err)
	}
	defer m.Close()
	var rec drainRecord
	if err := m.Lookup(uint32(0), &rec); err != nil {
		return fmt.Errorf("read the pinned drain record: %w", err)
	}
	if err := b.resumeInterval(rec, now); err != nil {
		return err
	}
	b.setDrainState(rec)
	return nil
}

// discardHalves empties spill and cache half idx without counting it:
// their slots carry no interval, so a flow left in one would be counted
// again when programs next use the half. The map's values need nothing:
// their interval tags are older than any the drain will read.
func (b *Bundler) discardHalves(idx int) error {
	if err := b.quiesce(idx); err != nil {
		return err
	}
	sp, err := b.readSpill(idx)
	if err != nil {
		return err
	}
	return b.freeSpill(idx, sp)
}

// resumeInterval checks that the interval an adopted side's programs
// count follows its drain record, and finishes the switch a process
// killed inside Collect did not make: programs count the interval after
// the pending one, so that the pending one is read whole. (Its grace
// period comes before the read: readPending.)
func (b *Bundler) resumeInterval(rec drainRecord, now uint64) error {
	switch {
	case now == rec.Gen+1:
		return nil
	case rec.Pending != 0 && now == rec.Gen:
		if err := b.setInterval(rec.Gen + 1); err != nil {
			return err
		}
		b.active = int((rec.Gen + 1) & 1)
		return nil
	}
	return fmt.Errorf("the kernel side pinned at %s counts interval %d, but its drain record says %d was the last collected: remove it with deptrace cleanup --pin-path %s", b.cfg.PinPath, now, rec.Gen, b.cfg.PinPath)
}

// writeDrainRecord records that interval gen is collected and pending, or
// committed. One map update: a process killed around it leaves either the
// old record or the new one.
func (b *Bundler) writeDrainRecord(gen uint64, pending bool) error {
	m, err := ebpf.LoadPinnedMap(b.drainRecordPath(), nil)
	if err != nil {
		return fmt.Errorf("open the pinned drain record: %w", err)
	}
	defer m.Close()
	rec := drainRecord{Side: b.drain.side, Gen: gen}
	if pending {
		rec.Pending = 1
	}
	if err := m.Put(uint32(0), rec); err != nil {
		return fmt.Errorf("record drain generation %d: %w", gen, err)
	}
	return nil
}

// salvageResult is what salvage read from a replaced side.
type salvageResult struct {
	// pending is the interval the side's process had collected and not
	// committed, under its own Side and Gen (Gen 0: none). That process
	// may have stored it before it died: reported under its own batch id,
	// a store that applies each batch id once does not count it twice.
	pending Interval
	// current is what programs counted since, never collected.
	current    []Entry
	unreadable int
}

// flowLayoutPerCPU is the layout before flowLayout 5: today's key, value
// and slots, with flow maps that hold a value per CPU. A side pinned by
// such a build (replaced by an upgrade) is salvaged too.
const flowLayoutPerCPU = 4

// salvage reads what an incompatible pinned side counted (flow maps,
// spill and flow cache), if it was written in today's layout (or
// flowLayoutPerCPU's); otherwise its entries are counted as unreadable,
// as are those of a map whose read fails.
func (p *pinnedSide) salvage(ncpu int) (s salvageResult) {
	flowMapType := ebpf.Hash
	if p.layout == flowLayoutPerCPU {
		flowMapType = ebpf.PerCPUHash
	}
	readable := p.layout == flowLayout || p.layout == flowLayoutPerCPU
	for _, m := range p.inner {
		readable = readable && (m == nil || m.Type() == flowMapType)
	}
	if !readable {
		// Same sizes need not mean the same fields (a reordered value
		// keeps its size): counted, never decoded.
		s.unreadable = p.countEntries()
		return s
	}
	// Map values count only when tagged with the interval its programs
	// count (current), or with the interval collected but not committed
	// (pending); older ones were committed. The spill and the cache hold
	// an interval per half (gen & 1): the pending one's half was not
	// freed, a committed one's was.
	var now uint64
	if m := p.maps["interval_now"]; m != nil {
		_ = m.Lookup(uint32(0), &now) // unread: 0 matches no value, all are left out
	}
	var rec drainRecord
	if p.drain == nil || p.drain.Lookup(uint32(0), &rec) != nil || rec.Pending == 0 || rec.Gen == now {
		// (A record pending with programs still counting its interval:
		// killed before the switch, that interval was never read.)
		rec = drainRecord{}
	}
	s.pending = Interval{Side: rec.Side, Gen: rec.Gen}
	add := func(into *[]Entry, k bundlerFlowKey, vals []bundlerFlowValue) {
		if e := merge(k, vals); e.Counts != (Counts{}) {
			*into = append(*into, e)
		}
	}
	var cur, pend []bundlerFlowValue
	addMap := func(k bundlerFlowKey, vals []bundlerFlowValue) { // a key's value, or one per CPU
		cur, pend = cur[:0], pend[:0]
		for _, v := range vals {
			switch v.Gen {
			case 0: // never written, or rec.Gen none
			case now:
				cur = append(cur, v)
			case rec.Gen:
				pend = append(pend, v)
			}
		}
		if len(cur) > 0 {
			add(&s.current, k, cur)
		}
		if len(pend) > 0 {
			add(&s.pending.Entries, k, pend)
		}
	}
	// A slot of the pending interval's half, or of the other one.
	addSlot := func(slot bundlerSpillSlot, half uint32) {
		if slot.State != uint32(bundlerSpillStateSPILL_READY) {
			return
		}
		into := &s.current
		if rec.Gen != 0 && half == uint32(rec.Gen&1) {
			into = &s.pending.Entries
		}
		add(into, slot.Key, []bundlerFlowValue{bundlerFlowValue(slot.Value)})
	}
	for _, m := range p.inner {
		if m == nil {
			continue
		}
		var k bundlerFlowKey
		vals := make([]bundlerFlowValue, 1)
		if flowMapType == ebpf.PerCPUHash {
			vals = make([]bundlerFlowValue, ncpu)
		}
		var it *ebpf.MapIterator
		read := 0
		if len(vals) == 1 {
			for it = m.Iterate(); it.Next(&k, &vals[0]); read++ {
				addMap(k, vals)
			}
		} else {
			for it = m.Iterate(); it.Next(&k, &vals); read++ {
				addMap(k, vals)
			}
		}
		if it.Err() != nil {
			s.unreadable += max(countKeys(m)-read, 1) // those not read, at least the failed one
		}
	}
	var i uint32
	if m := p.maps["spill"]; m != nil {
		perHalf := max(1, m.MaxEntries()/2)
		var slot bundlerSpillSlot
		it := m.Iterate()
		for it.Next(&i, &slot) {
			addSlot(slot, i/perHalf)
		}
		if it.Err() != nil {
			s.unreadable++ // slots in use unknown: at least the failed one
		}
	}
	if m := p.maps["flow_cache"]; m != nil {
		perHalf := max(1, m.MaxEntries()/2)
		cpus := make([]bundlerSpillSlot, ncpu)
		it := m.Iterate()
		for it.Next(&i, &cpus) {
			for _, slot := range cpus {
				addSlot(slot, i/perHalf)
			}
		}
		if it.Err() != nil {
			s.unreadable++
		}
	}
	if len(s.pending.Entries) > 0 {
		s.pending.Recovered = true
	} else {
		s.pending = Interval{}
	}
	return s
}

// countEntries counts what a side holds that cannot be read: flow map
// keys, and spill and cache slots in use (their state leads every slot
// layout so far; 0 is free).
func (p *pinnedSide) countEntries() int {
	n := 0
	for _, m := range p.inner {
		if m != nil {
			n += countKeys(m)
		}
	}
	if m := p.maps["spill"]; m != nil {
		var i uint32
		var raw []byte
		for it := m.Iterate(); it.Next(&i, &raw); {
			if len(raw) >= 4 && binary.NativeEndian.Uint32(raw) != 0 {
				n++
			}
		}
	}
	if m := p.maps["flow_cache"]; m != nil && m.ValueSize() == uint32(binarySize[bundlerSpillSlot]()) {
		var i uint32
		var cpus []bundlerSpillSlot
		for it := m.Iterate(); it.Next(&i, &cpus); {
			for _, s := range cpus {
				if s.State != 0 {
					n++
				}
			}
		}
	}
	return n
}

// countKeys counts m's keys, whatever its value layout.
func countKeys(m *ebpf.Map) int {
	n := 0
	var key, next []byte
	for err := m.NextKey(nil, &next); err == nil; err = m.NextKey(key, &next) {
		key = append(key[:0], next...)
		n++
	}
	return n
}

// removePinned detaches a pinned kernel side and deletes its pins: only
// the names deptrace pins (isPinName). The directory goes too unless it
// holds something else, which is left with it, no error: a new side can
// be pinned beside it (Load), a clean stop still detaches (Close);
// Cleanup, asked by a person, says what was left (foreignPins).
func removePinned(path string, p *pinnedSide) error {
	var errs []error
	if p != nil {
		for _, l := range p.links {
			if err := l.Unpin(); err != nil {
				errs = append(errs, err)
			}
		}
		p.close() // the last reference: programs detach
	}
	entries, _ := os.ReadDir(path)
	for _, e := range entries {
		if !isPinName(e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(path, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(foreignPins(path)) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// foreignPins lists the entries at path that deptrace does not pin.
func foreignPins(path string) []string {
	entries, _ := os.ReadDir(path)
	var others []string
	for _, e := range entries {
		if !isPinName(e.Name()) {
			others = append(others, e.Name())
		}
	}
	return others
}

// isPinName: the names deptrace pins under its pin path (pinSide), the
// only entries there it ever removes.
func isPinName(name string) bool {
	return name == "meta" || name == drainPin || strings.HasPrefix(name, "map_") || strings.HasPrefix(name, "link_")
}

// Cleanup removes a kernel side left pinned at path by an agent that was
// killed or stopped with --keep-tracing. It refuses while an agent owns it.
//
// Only a directory on bpffs that deptrace pinned is touched, and in it only
// the names deptrace pins: a --pin-path given by mistake (a home
// directory, /etc, bpffs's root with other tools' pins) loses nothing.
func Cleanup(path string) (found bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("statfs: %w", err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return false, errors.New("not on bpffs, so no kernel side can be pinned there: nothing removed (want the agent's --pin-path, a directory under a bpffs mount such as /sys/fs/bpf)")
	}
	lock, err := lockAgent(path)
	if err != nil {
		return false, err
	}
	defer lock.release()
	p, ok, err := loadPinned(path)
	if !ok {
		if err != nil {
			return false, err
		}
		// No meta pin, deptrace's first: a directory left by a start
		// that stopped before pinning or a removal cut short (only
		// deptrace's names, if any: removed), or someone else's.
		entries, readErr := os.ReadDir(path)
		if readErr != nil {
			return false, fmt.Errorf("read: %w", readErr)
		}
		if others := foreignPins(path); len(others) > 0 {
			return false, fmt.Errorf("no deptrace kernel side is pinned there (no meta pin) and it holds what deptrace does not pin (%s): nothing removed", strings.Join(others, ", "))
		}
		return len(entries) > 0, removePinned(path, nil)
	}
	err = errors.Join(err, removePinned(path, p))
	if others := foreignPins(path); len(others) > 0 {
		err = errors.Join(err, fmt.Errorf("removed deptrace's pins; left the directory in place: it also holds what deptrace did not pin there (%s)", strings.Join(others, ", ")))
	}
	return true, err
}
