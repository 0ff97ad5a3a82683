package graph

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// index gives the adjacency the queries walk.
type index struct {
	g     Graph
	nodes map[string]Node
	out   map[string][]Edge // by From
	in    map[string][]Edge // by To
	// services of each (host, process), for walking from a process to
	// what depends on it, and back.
	servicesOf map[string][]string
}

func newIndex(g Graph) *index {
	ix := &index{g: g, nodes: map[string]Node{}, out: map[string][]Edge{}, in: map[string][]Edge{}, servicesOf: map[string][]string{}}
	for _, n := range g.Nodes {
		ix.nodes[n.ID] = n
		if n.Kind == KindService && n.Process != "" {
			p := ProcessID(n.Host, n.Process)
			ix.servicesOf[p] = append(ix.servicesOf[p], n.ID)
		}
	}
	for _, e := range g.Edges {
		ix.out[e.From] = append(ix.out[e.From], e)
		ix.in[e.To] = append(ix.in[e.To], e)
	}
	// A process that only serves has no node of its own: give it one so
	// that it can be looked at as a whole.
	for _, n := range g.Nodes {
		if p := ProcessID(n.Host, n.Process); n.Kind == KindService && n.Process != "" {
			if _, ok := ix.nodes[p]; !ok {
				ix.nodes[p] = Node{ID: p, Kind: KindProcess, Host: n.Host, Addr: n.Addr, Process: n.Process, Identity: n.Identity}
			}
		}
	}
	return ix
}

// outgoing is what node id depends on: a process's own edges; for a
// service, the edges of the process that serves it.
func (ix *index) outgoing(id string) []Edge {
	n := ix.nodes[id]
	if n.Kind == KindService {
		return ix.out[ProcessID(n.Host, n.Process)]
	}
	return ix.out[id]
}

// incoming is what depends on node id: a service's edges; for a process,
// the edges into every service it serves.
func (ix *index) incoming(id string) []Edge {
	n := ix.nodes[id]
	if n.Kind != KindProcess {
		return ix.in[id]
	}
	var es []Edge
	for _, s := range ix.servicesOf[id] {
		es = append(es, ix.in[s]...)
	}
	return es
}

// TargetPort is the port of a target that names one TCP or UDP service by
// address ("10.0.1.10:5432"), 0 for any other: Look and Reachable keep the
// dependents of the roots Resolve finds for it to that service's, where a
// root is a whole process or workload with other services beside it.
func TargetPort(target string) uint16 {
	if ap, err := netip.ParseAddrPort(strings.TrimSpace(target)); err == nil {
		return ap.Port()
	}
	return 0
}

// incomingAt is incoming, kept to the edges into port (0: every edge) where
// id is a process or workload: a service node (format 1) or an external
// endpoint is one service already.
func (ix *index) incomingAt(id string, port uint16) []Edge {
	es := ix.incoming(id)
	if n := ix.nodes[id]; port == 0 || n.Kind == KindService || n.Kind == KindExternal {
		return es
	}
	return slices.DeleteFunc(slices.Clone(es), func(e Edge) bool { return e.Proto == "unix" || e.Port != port })
}

// Resolve finds what a user means by target: "addr:port" (one service or
// external endpoint), a unix socket path ("/run/app.sock", "@name"), an address (everything on the host that holds it, or
// the external endpoint), the DNS name of external servers ("api.example.com",
// any case, every port; "api.example.com:443" one), a host id or name (everything on it), a
// workload, pod, container or systemd unit (see IdentityMatches), or a
// process name. Except for addr:port, results are entities: a process on a
// host, with all its services (see ProcessID).
func Resolve(g Graph, hosts []store.Host, target string) ([]string, error) {
	target = strings.TrimSpace(target)
	if target == "" {
		return nil, fmt.Errorf("empty target: give a host, an address, address:port, a unix socket path, a workload, pod, container or unit, or a process name")
	}
	var ids []string
	add := func(id string) {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	entities := func(pred func(Node) bool) {
		for _, n := range g.Nodes {
			if pred(n) {
				add(entityKey(n))
			}
		}
	}
	// The hosts holding each address: loopback and link-local ones are
	// held by every network namespace, and none of them is the one meant.
	owners := map[string][]string{}
	for _, h := range hosts {
		for _, a := range h.Addrs {
			owners[a] = append(owners[a], h.ID)
		}
	}
	if strings.HasPrefix(target, "/") || strings.HasPrefix(target, "@") {
		// A unix socket path (or abstract name): its service on every host.
		for _, n := range g.Nodes {
			if n.Kind == KindService && n.Proto == "unix" && n.Addr == target {
				add(n.ID)
			}
			for _, sv := range n.Services {
				if sv.Proto == "unix" && sv.Addr == target {
					add(n.ID)
				}
			}
		}
	} else if ap, err := netip.ParseAddrPort(target); err == nil {
		addr := ap.Addr().Unmap().String()
		held := owners[addr]
		for _, n := range g.Nodes {
			onHolder := slices.Contains(held, n.Host)
			if n.Port == ap.Port() && ((n.Kind == KindService && onHolder) || (n.Kind == KindExternal && n.Addr == addr)) {
				add(n.ID)
			}
			if onHolder && slices.ContainsFunc(n.Services, func(sv Service) bool { return sv.Proto != "unix" && sv.Port == ap.Port() }) {
				add(n.ID)
			}
		}
	} else if a, err := netip.ParseAddr(target); err == nil {
		addr := a.Unmap().String()
		held := owners[addr]
		entities(func(n Node) bool { return slices.Contains(held, n.Host) || (n.Kind == KindExternal && n.Addr == addr) })
	} else {
		// A DNS name an external server was answered for, or name:port.
		name := strings.TrimSuffix(target, ".")
		for _, n := range g.Nodes {
			if n.Kind == KindExternal && n.RemoteName != "" && (strings.EqualFold(n.RemoteName, name) ||
				strings.EqualFold(n.RemoteName+":"+strconv.Itoa(int(n.Port)), name)) {
				add(n.ID)
			}
		}
		exact := slices.ContainsFunc(hosts, func(h store.Host) bool { return h.ID == target || h.Name == target })
		for _, h := range hosts {
			// A machine's id names the hosts of its namespaces when it
			// names no host itself: an agent run with --host-id vm and
			// --netns only has "vm/qa-b" and no "vm". A namespace's id
			// without its cookie ("vm/netns:4026532388", the inode lsns
			// shows) names the namespaces that had that inode.
			if h.ID == target || h.Name == target || (!exact && (strings.HasPrefix(h.ID, target+"/") ||
				strings.Contains(target, "/netns:") && strings.HasPrefix(h.ID, target+"."))) {
				entities(func(n Node) bool { return n.Host == h.ID })
			}
		}
		if len(ids) == 0 {
			// What operators call it: a workload, pod, container or unit;
			// and a process of that exact name too.
			entities(func(n Node) bool {
				return n.Kind != KindExternal && (IdentityMatches(n.Identity, target) || n.Name == target || slices.Contains(processes(n), target) ||
					slices.ContainsFunc(n.members, func(id tracer.Identity) bool { return IdentityMatches(id, target) }))
			})
		}
		if len(ids) == 0 {
			name, err := MatchProcess(g, target)
			if err != nil {
				return nil, err
			}
			if name != "" {
				entities(func(n Node) bool { return slices.Contains(processes(n), name) })
			}
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no host, address, service or process matches %q in the selected time range", target)
	}
	return ids, nil
}

// Branch is one edge of a look tree and what lies behind it.
type Branch struct {
	Edge     Edge
	Peer     Node // the service (outbound) or client (inbound)
	Via      Node // inbound: the service of the root the edge enters
	Children []*Branch
	Repeat   bool // Peer already appears above: not expanded again
}

// Tree is what look shows for one root node.
type Tree struct {
	Root     Node
	Outbound []*Branch
	Inbound  []*Branch
}

// Look builds, for each root, the dependencies (outbound) and dependents
// (inbound) up to depth levels (depth <= 0: unlimited); port, when not 0,
// keeps a root's dependents to those of that service (TargetPort). Each
// node is expanded once per direction; a cycle or a shared dependency
// shows as a repeat.
func Look(g Graph, roots []string, depth int, outbound, inbound bool, port uint16) []Tree {
	ix := newIndex(g)
	var trees []Tree
	for _, r := range roots {
		t := Tree{Root: ix.nodes[r]}
		if outbound {
			t.Outbound = ix.walk(ix.outgoing(r), depth, true, map[string]bool{r: true})
		}
		if inbound {
			t.Inbound = ix.walk(ix.incomingAt(r, port), depth, false, map[string]bool{r: true})
		}
		trees = append(trees, t)
	}
	return trees
}

// walk makes a branch of each edge, and of what lies behind its peer.
func (ix *index) walk(edges []Edge, depth int, outbound bool, seen map[string]bool) []*Branch {
	var out []*Branch
	for _, e := range edges {
		peerID := e.To
		if !outbound {
			peerID = e.From
		}
		b := &Branch{Edge: e, Peer: ix.nodes[peerID]}
		if !outbound {
			b.Via = ix.nodes[e.To]
		}
		// The same (host, process) reached through another of its
		// services counts as seen too.
		key := entityKey(b.Peer)
		if seen[peerID] || seen[key] {
			b.Repeat = true
		} else {
			seen[peerID], seen[key] = true, true
			if depth != 1 {
				next := ix.incoming(peerID)
				if outbound {
					next = ix.outgoing(peerID)
				}
				b.Children = ix.walk(next, depth-1, outbound, seen)
			}
		}
		out = append(out, b)
	}
	return out
}

// processes are the process names of a node: one, or a workload's
// several.
func processes(n Node) []string {
	if len(n.Processes) > 0 {
		return n.Processes
	}
	if n.Process == "" {
		return nil
	}
	return []string{n.Process}
}

func entityKey(n Node) string {
	if n.Kind == KindExternal || n.Kind == KindWorkload || n.Kind == KindHost || n.Process == "" {
		return n.ID
	}
	return ProcessID(n.Host, n.Process)
}

// EdgeKey tells edges apart: in a grouped graph one pair of workloads can
// have several edges, one per protocol and server port.
type EdgeKey struct {
	From, To, Proto string
	Port            uint16
}

// KeyOf is e's EdgeKey.
func KeyOf(e Edge) EdgeKey { return EdgeKey{e.From, e.To, e.Proto, e.Port} }

// Reachable returns the subgraph of nodes within depth edges of roots, in
// either direction (depth <= 0: unlimited); port, when not 0, keeps the
// roots' dependents to those of that service (TargetPort).
func Reachable(g Graph, roots []string, depth int, port uint16) Graph {
	ix := newIndex(g)
	if depth <= 0 {
		depth = -1 // never reaches 0 below: unlimited
	}
	keep := map[string]bool{}
	edges := map[EdgeKey]bool{}
	var visit func(id string, d int, outbound bool)
	visit = func(id string, d int, outbound bool) {
		keep[id] = true
		if d == 0 {
			return
		}
		var es []Edge
		switch {
		case outbound:
			es = ix.outgoing(id)
		case slices.Contains(roots, id):
			es = ix.incomingAt(id, port)
		default:
			es = ix.incoming(id)
		}
		for _, e := range es {
			k := KeyOf(e)
			if edges[k] {
				continue
			}
			edges[k] = true
			keep[e.From], keep[e.To] = true, true
			next := e.To
			if !outbound {
				next = e.From
			}
			visit(next, d-1, outbound)
		}
	}
	for _, r := range roots {
		visit(r, depth, true)
		visit(r, depth, false)
	}
	out := Graph{Format: g.Format, Nodes: []Node{}, Edges: []Edge{}}
	for _, n := range g.Nodes {
		if keep[n.ID] {
			out.Nodes = append(out.Nodes, n)
		}
	}
	for _, e := range g.Edges {
		if edges[KeyOf(e)] {
			out.Edges = append(out.Edges, e)
		}
	}
	return out
}

// Diff lists the edges of after that before lacks (appeared) and those of
// before that after lacks (disappeared).
//
// An edge is its two ends, its protocol and its server port: in a
// grouped graph one pair of workloads can have several edges.
func Diff(before, after Graph) (appeared, disappeared []Edge) {
	has := func(g Graph) map[EdgeKey]bool {
		m := map[EdgeKey]bool{}
		for _, e := range g.Edges {
			m[KeyOf(e)] = true
		}
		return m
	}
	b, a := has(before), has(after)
	for _, e := range after.Edges {
		if !b[KeyOf(e)] {
			appeared = append(appeared, e)
		}
	}
	for _, e := range before.Edges {
		if !a[KeyOf(e)] {
			disappeared = append(disappeared, e)
		}
	}
	return appeared, disappeared
}

// MatchProcess finds the process name a person means by typed: the exact
// name; else the one name that matches ignoring case; else the one name
// that starts with typed; else the one that contains it ("redis" finds
// "redis-server"). When a step matches several names the error lists them;
// when nothing matches, it returns "" and no error.
func MatchProcess(g Graph, typed string) (string, error) {
	names := map[string]bool{}
	for _, n := range g.Nodes {
		for _, p := range processes(n) {
			names[p] = true
		}
	}
	if names[typed] {
		return typed, nil
	}
	lower := strings.ToLower(typed)
	for _, step := range []struct {
		how   string
		match func(name string) bool
	}{
		{"ignoring case", func(name string) bool { return name == lower }},
		{"by prefix", func(name string) bool { return strings.HasPrefix(name, lower) }},
		{"by substring", func(name string) bool { return strings.Contains(name, lower) }},
	} {
		var found []string
		for name := range names {
			if step.match(strings.ToLower(name)) {
				found = append(found, name)
			}
		}
		switch len(found) {
		case 0:
			continue
		case 1:
			return found[0], nil
		}
		slices.Sort(found)
		const most = 10
		list := strings.Join(found[:min(len(found), most)], ", ")
		if len(found) > most {
			list += fmt.Sprintf(" and %d more", len(found)-most)
		}
		return "", fmt.Errorf("%q matches several processes %s: %s; give the full name", typed, step.how, list)
	}
	return "", nil
}

// IdentityMatches reports whether typed names id the way an operator
// would: its workload ("Deployment/checkout", or its name "checkout";
// "compose/shop/web" or "web"), its pod ("checkout-7d4b9-x2x4k" or
// "shop/checkout-7d4b9-x2x4k"), its container's name, its container id
// (12 characters or more of it), or its systemd unit ("nginx.service"
// or "nginx").
func IdentityMatches(id tracer.Identity, typed string) bool {
	if typed == "" || id.Empty() {
		return false
	}
	if w := id.Workload; w != "" && (w == typed || w[strings.LastIndexByte(w, '/')+1:] == typed) {
		return true
	}
	if id.PodName != "" && (id.PodName == typed || id.PodNamespace+"/"+id.PodName == typed) {
		return true
	}
	if id.ContainerName != "" && id.ContainerName == typed {
		return true
	}
	if len(typed) >= 12 && strings.HasPrefix(id.ContainerID, typed) {
		return true
	}
	if u := id.Unit; u != "" && (u == typed || strings.TrimSuffix(u, ".service") == typed) {
		return true
	}
	return false
}
