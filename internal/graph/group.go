package graph

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/deptrace/deptrace/tracer"
)

// Kinds of the nodes of a grouped graph (format 2).
const (
	// KindWorkload is a workload on a host: a process, or the container,
	// pod or systemd service its processes run in, with the services it
	// listens on as attributes.
	KindWorkload = "workload"
	// KindHost is every process of a host as one node (--group-by host).
	KindHost = "host"
)

// Group levels accepted by --group-by and ?group_by=.
const (
	ByProcess  = "process"
	ByWorkload = "workload"
	ByHost     = "host"
)

// GroupBys lists the levels, the default first.
var GroupBys = []string{ByWorkload, ByProcess, ByHost}

// Service is a listening service of a workload node: what a format-1
// graph shows as a node of its own.
type Service struct {
	Proto string `json:"proto"`
	Port  uint16 `json:"port"`
	// Addr is a unix service's socket path; empty otherwise.
	Addr    string `json:"addr,omitempty"`
	Process string `json:"process"`
	// Listener is the accept queue over the range, as on a format-1
	// service node.
	Listener  *ListenerState `json:"listener,omitempty"`
	Unhealthy bool           `json:"unhealthy"`
	Reasons   []string       `json:"reasons,omitempty"`
	Health    string         `json:"health,omitempty"`
	// Unanswered (set by Judge): clients asked for the service and
	// nothing answered: no connection worked, no listener was seen.
	Unanswered bool `json:"unanswered,omitempty"`
}

// String is how a service reads: "tcp/5432", "unix /run/app.sock".
func (s Service) String() string {
	if s.Proto == "unix" {
		return "unix " + s.Addr
	}
	return fmt.Sprintf("%s/%d", s.Proto, s.Port)
}

// groupKey names the workload node a format-1 process or service node
// belongs to at level by, and the name it shows.
func groupKey(n Node, by string) (id, name string) {
	if by == ByHost {
		return "host:" + n.Host, n.Host
	}
	id = "workload:" + n.Host + "/"
	if by == ByWorkload {
		who := n.Identity
		switch {
		case who.Workload != "":
			return id + who.Workload, who.Workload
		case who.PodName != "":
			p := who.PodNamespace + "/" + who.PodName
			return id + "pod:" + p, p
		case who.ContainerID != "":
			c := who.ContainerName
			if c == "" {
				c = who.ContainerID[:min(12, len(who.ContainerID))]
			}
			return id + "container:" + who.ContainerID, c
		case strings.HasSuffix(who.Unit, ".service"):
			return id + "unit:" + who.Unit, who.Unit
		}
	}
	if n.Process != "" {
		return id + n.Process, n.Process
	}
	// A service whose process is unknown stays a node of its own rather
	// than joining the other unknown ones of its host.
	if n.Kind == KindService {
		return id + "?" + n.Proto + "/" + n.Addr + "/" + fmt.Sprint(n.Port), "?"
	}
	return id + "?", "?"
}

// mergeIdentity keeps the identity fields every member of a group
// shares (a pod's containers share the pod, not the container).
func mergeIdentity(a *tracer.Identity, b tracer.Identity) {
	for _, f := range [...]struct {
		x *string
		y string
	}{
		{&a.Unit, b.Unit}, {&a.ContainerID, b.ContainerID}, {&a.ContainerName, b.ContainerName},
		{&a.ContainerImage, b.ContainerImage}, {&a.ContainerRuntime, b.ContainerRuntime},
		{&a.PodNamespace, b.PodNamespace}, {&a.PodName, b.PodName}, {&a.PodUID, b.PodUID},
		{&a.K8sContainer, b.K8sContainer}, {&a.Workload, b.Workload},
	} {
		if *f.x != f.y {
			*f.x = ""
		}
	}
}

// Group turns a format-1 graph (process, service and external nodes, as
// Build makes it) into the graph people read (format 2): one node per
// workload on a host at level by (ByProcess, ByWorkload, ByHost),
// carrying its listening services, and one edge per (client workload,
// server workload, proto, port), so that a chain of services is a chain
// of edges. External nodes stay. Edge counters are summed and health is
// judged again on the sums.
func Group(g Graph, by string) Graph {
	out := Graph{Format: 2, Nodes: []Node{}, Edges: []Edge{}}
	to := make(map[string]string, len(g.Nodes)) // format-1 id -> format-2 id
	idx := map[string]int{}
	seen := map[string]bool{}
	for _, n := range g.Nodes {
		if n.Kind == KindExternal {
			to[n.ID] = n.ID
			idx[n.ID] = len(out.Nodes)
			out.Nodes = append(out.Nodes, n)
			continue
		}
		id, name := groupKey(n, by)
		to[n.ID] = id
		i, ok := idx[id]
		if !ok {
			i = len(out.Nodes)
			idx[id] = i
			kind := KindWorkload
			if by == ByHost {
				kind = KindHost
			}
			w := Node{ID: id, Kind: kind, Host: n.Host, Name: name, Identity: n.Identity}
			if by == ByHost {
				w.Identity = tracer.Identity{}
			}
			out.Nodes = append(out.Nodes, w)
		}
		w := &out.Nodes[i]
		if by != ByHost && seen[id] {
			mergeIdentity(&w.Identity, n.Identity)
		}
		seen[id] = true
		if !n.Identity.Empty() && !slices.Contains(w.members, n.Identity) {
			w.members = append(w.members, n.Identity)
		}
		if w.Addr == "" && n.Proto != "unix" {
			w.Addr = n.Addr
		}
		if n.Process != "" && !slices.Contains(w.Processes, n.Process) {
			w.Processes = append(w.Processes, n.Process)
		}
		w.DNS = mergeDNS(w.DNS, n.DNS)
		if n.Kind == KindService {
			s := Service{Proto: n.Proto, Port: n.Port, Process: n.Process, Listener: n.Listener, Unhealthy: n.Unhealthy, Reasons: n.Reasons}
			if n.Proto == "unix" {
				s.Addr = n.Addr
			}
			w.Services = append(w.Services, s)
		}
	}
	hostAddr := map[string]string{}
	for _, w := range out.Nodes {
		if w.Kind != KindExternal && w.Addr != "" {
			hostAddr[w.Host] = w.Addr
		}
	}
	for i := range out.Nodes {
		w := &out.Nodes[i]
		if w.Kind == KindExternal {
			continue
		}
		if w.Addr == "" {
			// A workload with only unix services: its host's address.
			w.Addr = hostAddr[w.Host]
		}
		slices.Sort(w.Processes)
		w.Process = strings.Join(w.Processes, ",")
		if len(w.Processes) < 2 {
			w.Processes = nil
		}
		slices.SortFunc(w.Services, func(a, b Service) int {
			return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Addr, b.Addr))
		})
		w.Unhealthy, w.Reasons = false, nil
		for _, s := range w.Services {
			if s.Unhealthy {
				w.Unhealthy = true
				for _, r := range s.Reasons {
					w.Reasons = append(w.Reasons, s.String()+": "+r)
				}
			}
		}
	}
	slices.SortFunc(out.Nodes, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })

	type ek struct {
		from, to, proto string
		port            uint16
	}
	eidx := map[ek]int{}
	unixPath := map[string]string{} // a format-1 unix service's id -> its path
	for _, n := range g.Nodes {
		if n.Kind == KindService && n.Proto == "unix" {
			unixPath[n.ID] = n.Addr
		}
	}
	for _, e := range g.Edges {
		k := ek{to[e.From], to[e.To], e.Proto, e.Port}
		i, ok := eidx[k]
		if !ok {
			i = len(out.Edges)
			eidx[k] = i
			out.Edges = append(out.Edges, Edge{From: k.from, To: k.to, Proto: e.Proto, Port: e.Port, FirstSeen: e.FirstSeen, LastSeen: e.LastSeen})
		}
		x := &out.Edges[i]
		for _, p := range append(slices.Clone(e.Addrs), unixPath[e.To]) {
			if p != "" && !slices.Contains(x.Addrs, p) {
				x.Addrs = append(x.Addrs, p)
			}
		}
		x.Counters.Add(e.Counters)
		if !e.FirstSeen.IsZero() && (x.FirstSeen.IsZero() || e.FirstSeen.Before(x.FirstSeen)) {
			x.FirstSeen = e.FirstSeen
		}
		if e.LastSeen.After(x.LastSeen) {
			x.LastSeen = e.LastSeen
		}
	}
	for i := range out.Edges {
		slices.Sort(out.Edges[i].Addrs)
		out.Edges[i].health()
		out.Edges[i].RTTAvgUs = out.Edges[i].Counters.RTTAvgUs()
	}
	slices.SortFunc(out.Edges, func(a, b Edge) int {
		return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// ValidGroupBy checks a --group-by value.
func ValidGroupBy(v string) error {
	if slices.Contains(GroupBys, v) {
		return nil
	}
	return fmt.Errorf("invalid --group-by %q: allowed %s", v, strings.Join(GroupBys, ", "))
}
