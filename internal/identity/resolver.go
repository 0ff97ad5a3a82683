package identity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/deptrace/deptrace/internal/kernel"
	"github.com/deptrace/deptrace/tracer"
)

// Default runtime sockets.
const (
	DefaultDockerSocket     = "/var/run/docker.sock"
	DefaultPodmanSocket     = "/run/podman/podman.sock"
	DefaultContainerdSocket = "/run/containerd/containerd.sock"
	DefaultCRIOSocket       = "/var/run/crio/crio.sock"
)

// Config says where the runtimes listen. An empty socket turns that
// runtime's lookups off; a socket that does not exist is retried.
//
// A runtime that does not answer is logged once per outage, at warn
// level, when its names are lost: it answered before, its containers are
// in the cgroup tree, or its socket is there but refuses (or is no
// socket). A socket that is simply not there is the normal state of a
// host without that runtime and is not logged, or at info level when it
// is not the runtime's default path (so it was set). When it answers
// again, one info line says so.
type Config struct {
	// CgroupRoot is the cgroup v2 mount; "" finds it in mountinfo.
	CgroupRoot       string
	DockerSocket     string
	PodmanSocket     string
	ContainerdSocket string
	CRIOSocket       string
	// Retain is how long an exited container (and a removed cgroup) stays
	// known, and how long an identity unused by any flow stays cached.
	Retain time.Duration
	// Timeout bounds one runtime API call.
	Timeout time.Duration
	// Log gets the lines about runtimes that stop and start answering;
	// nil is slog's default logger with component=identity.
	Log *slog.Logger
}

// DefaultConfig uses every runtime at its usual socket.
func DefaultConfig() Config {
	return Config{DockerSocket: DefaultDockerSocket, PodmanSocket: DefaultPodmanSocket,
		ContainerdSocket: DefaultContainerdSocket, CRIOSocket: DefaultCRIOSocket,
		Retain: 10 * time.Minute, Timeout: 2 * time.Second}
}

// retryAfter is how long an identity that could not be completed (the
// runtime was unreachable, the cgroup unknown) is kept before asking again.
const retryAfter = 10 * time.Second

// Resolver maps cgroup ids to identities, caching each. It is safe for
// concurrent use.
type Resolver struct {
	cfg    Config
	tree   *cgroupTree
	docker *dockerClient // nil when off
	podman *dockerClient
	cris   []*criClient // containerd, CRI-O
	byRT   map[string]*criClient

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	cache     map[uint64]*cached
	lastPrune time.Time

	prefetching chan struct{} // bounds concurrent prefetches
}

// maxPrefetch bounds the runtime lookups running at once for new
// containers' cgroups; beyond it, a container is looked up at its first
// flow instead.
const maxPrefetch = 4

// prefetchDelays are the waits before each lookup of a new container's
// cgroup: its runtime may not answer for it until its creation is done.
var prefetchDelays = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, time.Second, 3 * time.Second}

type cached struct {
	id       tracer.Identity
	complete bool
	at, used time.Time
}

// New starts a resolver: it walks and watches the cgroup tree and follows
// the Docker and podman event streams. Runtimes that are not running are
// not an error: their lookups fail until they appear.
func New(cfg Config) (*Resolver, error) {
	if cfg.Retain <= 0 || cfg.Timeout <= 0 {
		return nil, fmt.Errorf("identity: retain %s and timeout %s must be positive", cfg.Retain, cfg.Timeout)
	}
	root := cfg.CgroupRoot
	if root == "" {
		var err error
		if root, err = kernel.CgroupV2Root(); err != nil {
			return nil, fmt.Errorf("identity: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Resolver{cfg: cfg, ctx: ctx, cancel: cancel, cache: map[uint64]*cached{}, byRT: map[string]*criClient{}, lastPrune: time.Now(),
		prefetching: make(chan struct{}, maxPrefetch)}
	tree, err := newCgroupTree(root, cfg.Retain, r.prefetch)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("identity: %w", err)
	}
	r.tree = tree
	log := cfg.Log
	if log == nil {
		log = slog.Default().With("component", "identity")
	}
	present := tree.runtimes()
	newSrc := func(rt, socket, def string) *source {
		s := newSource(rt, socket, socket != def, log)
		s.present = present[rt]
		return s
	}
	onStart := func(pid int) {
		if p, ok := PIDCgroupV2(pid); ok {
			tree.learn(p)
		}
	}
	for _, d := range []struct {
		rt, socket, def string
		dst             **dockerClient
	}{{RuntimeDocker, cfg.DockerSocket, DefaultDockerSocket, &r.docker}, {RuntimePodman, cfg.PodmanSocket, DefaultPodmanSocket, &r.podman}} {
		if d.socket == "" {
			continue
		}
		c := newDockerClient(newSrc(d.rt, d.socket, d.def), cfg.Retain, cfg.Timeout)
		c.onStart = onStart
		*d.dst = c
		r.wg.Add(1)
		go func() { defer r.wg.Done(); c.run(ctx) }()
	}
	for _, s := range []struct{ rt, socket, def string }{{RuntimeContainerd, cfg.ContainerdSocket, DefaultContainerdSocket}, {RuntimeCRIO, cfg.CRIOSocket, DefaultCRIOSocket}} {
		if s.socket == "" {
			continue
		}
		c := newCRIClient(newSrc(s.rt, s.socket, s.def), cfg.Timeout)
		r.cris = append(r.cris, c)
		r.byRT[s.rt] = c
		// No event stream to try it: a missing socket is told now (if
		// asked for, or its containers run), the rest at lookups.
		if err := checkSocket(s.socket); err != nil && noSocket(err) {
			c.src.failed(err, false)
		}
	}
	return r, nil
}

// prefetch names a container as soon as its cgroup is made, while the
// runtime still knows it: a container that lives for one request and is
// removed before the drain (a CRI one, which has no event stream to learn
// it from) is named all the same.
func (r *Resolver) prefetch(cgroupID uint64, path string) {
	if ParsePath(path).ContainerID == "" {
		return
	}
	select {
	case r.prefetching <- struct{}{}:
	default:
		return
	}
	r.wg.Add(1)
	go func() {
		defer func() { <-r.prefetching; r.wg.Done() }()
		for _, d := range prefetchDelays {
			select {
			case <-r.closed():
				return
			case <-time.After(d):
			}
			if id, complete := r.lookup(cgroupID); complete {
				now := time.Now()
				r.mu.Lock()
				r.cache[cgroupID] = &cached{id: id, complete: true, at: now, used: now}
				r.mu.Unlock()
				return
			}
		}
	}()
}

func (r *Resolver) closed() <-chan struct{} { return r.ctx.Done() }

// Close stops watching and following the runtimes.
func (r *Resolver) Close() error {
	r.cancel()
	r.tree.Close() // no new prefetches
	r.wg.Wait()
	for _, c := range r.cris {
		c.close()
	}
	return nil
}

// Annotate fills in the identity of every flow's local end from its
// cgroup id; each id is looked up once and then cached.
// Ids not cached yet are looked up concurrently (a few at a time), so an
// interval with many new containers waits about one runtime round trip.
func (r *Resolver) Annotate(flows []tracer.Flow) {
	now := time.Now()
	var fresh []uint64
	seen := map[uint64]bool{}
	r.mu.Lock()
	for i := range flows {
		id := flows[i].CgroupID
		if c, ok := r.cache[id]; id == 0 || seen[id] || ok && (c.complete || now.Sub(c.at) < retryAfter) {
			continue
		}
		seen[id] = true
		fresh = append(fresh, id)
	}
	r.mu.Unlock()
	if len(fresh) > 1 {
		var wg sync.WaitGroup
		sem := make(chan struct{}, maxConcurrentLookups)
		for _, id := range fresh {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				r.Resolve(id)
			}()
		}
		wg.Wait()
	}
	for i := range flows {
		flows[i].Identity = r.Resolve(flows[i].CgroupID)
	}
	r.maybePrune()
}

// maxConcurrentLookups bounds Annotate's lookups running at once.
const maxConcurrentLookups = 8

// Resolve returns the identity of the processes of a cgroup: empty for a
// plain host process or an unknown cgroup.
func (r *Resolver) Resolve(cgroupID uint64) tracer.Identity {
	if cgroupID == 0 {
		return tracer.Identity{}
	}
	now := time.Now()
	r.mu.Lock()
	c, ok := r.cache[cgroupID]
	if ok && (c.complete || now.Sub(c.at) < retryAfter) {
		c.used = now
		r.mu.Unlock()
		return c.id
	}
	r.mu.Unlock()
	// Not under the lock: runtime calls can take up to the timeout, and
	// two lookups of one new id at once only ask twice.
	id, complete := r.lookup(cgroupID)
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.cache[cgroupID]; ok && c.complete && !complete {
		c.used = now // a prefetch completed it meanwhile
		return c.id
	}
	r.cache[cgroupID] = &cached{id: id, complete: complete, at: now, used: now}
	return id
}

func (r *Resolver) lookup(cgroupID uint64) (tracer.Identity, bool) {
	path, ok := r.tree.Path(cgroupID)
	if !ok {
		return tracer.Identity{}, false
	}
	p := ParsePath(path)
	if p.ContainerID == "" {
		return tracer.Identity{Unit: p.Unit}, true
	}
	ctx := context.Background()
	base := tracer.Identity{ContainerID: p.ContainerID, ContainerRuntime: p.Runtime, PodUID: p.PodUID}
	if p.Runtime == runtimeCRI {
		base.ContainerRuntime = ""
	}
	var docker *dockerClient
	switch p.Runtime {
	case RuntimeDocker:
		docker = r.docker
	case RuntimePodman:
		docker = r.podman
	}
	if docker != nil {
		c, err := docker.lookup(ctx, p.ContainerID)
		if err != nil {
			return base, false
		}
		base.ContainerName, base.ContainerImage = c.name, c.image
		base.Workload = composeWorkload(c.labels)
		// A Docker container kubelet made (dockershim, cri-dockerd)
		// carries the same pod labels as a CRI one.
		if pod := c.labels[labelPodName]; pod != "" {
			base.PodName, base.PodNamespace = pod, c.labels[labelPodNamespace]
			base.PodUID, base.K8sContainer = cmpOr(c.labels[labelPodUID], base.PodUID), c.labels[labelContainerName]
		}
		return base, true
	}
	clients := r.cris
	if c, ok := r.byRT[p.Runtime]; ok {
		clients = []*criClient{c}
	} else if p.Runtime != runtimeCRI {
		return base, true // a runtime with no API configured: the path is all there is
	}
	var down []*criClient
	var downErrs []error
	for _, c := range clients {
		id, err := c.container(ctx, p.ContainerID)
		if err == nil {
			if id.PodUID == "" {
				id.PodUID = p.PodUID
			}
			return id, true
		}
		var u *unreachableError
		if errors.As(err, &u) {
			down, downErrs = append(down, c), append(downErrs, err)
		}
	}
	// The container needed its runtime. Under the cgroupfs driver the
	// path does not say which CRI runtime made it: a socket that is not
	// there is then one of a runtime this node does not run, unless
	// neither answered.
	allGone := len(down) == len(clients)
	for i, c := range down {
		c.src.failed(downErrs[i], len(clients) == 1 || allGone)
	}
	return base, false
}

// maybePrune forgets, once a minute, identities no flow used for Retain,
// and containers and cgroups gone for longer than that.
func (r *Resolver) maybePrune() {
	now := time.Now()
	r.mu.Lock()
	if now.Sub(r.lastPrune) < time.Minute {
		r.mu.Unlock()
		return
	}
	r.lastPrune = now
	for id, c := range r.cache {
		if now.Sub(c.used) > r.cfg.Retain {
			delete(r.cache, id)
		}
	}
	r.mu.Unlock()
	r.tree.prune(now)
	for _, d := range []*dockerClient{r.docker, r.podman} {
		if d != nil {
			d.prune(now)
		}
	}
}
