package tracer

import (
	"net/netip"
	"time"
)

// Proto is a flow's protocol, as Flow and its JSON name it.
type Proto string

// Protocols.
const (
	ProtoTCP  Proto = "tcp"
	ProtoUDP  Proto = "udp"
	ProtoUnix Proto = "unix"
)

// Direction says which end of a dependency the local end is, as Flow and
// its JSON name it.
type Direction string

// Directions.
const (
	// Outbound: the local end is the client of the dependency.
	Outbound Direction = "outbound"
	// Inbound: the local end is the server of the dependency.
	Inbound Direction = "inbound"
)

// Record kinds, as jsonl names them.
const (

	// KindFlow marks a Flow record in jsonl; KindListener a Listener.
	KindFlow     = "flow"
	KindListener = "listener"
)

// Counters are what deptrace counts on one dependency. The same type is
// carried by flows, stored observations and graph edges, and counters of
// one dependency add up with Add.
type Counters struct {
	// Connections counts connection opens that completed (TCP handshakes,
	// unix stream connects); FailedConnections those that did not. The
	// four Failed* causes sum to FailedConnections for TCP.
	Connections       uint64 `json:"connections"`
	FailedConnections uint64 `json:"failed_connections"`
	FailedRefused     uint64 `json:"failed_refused"`
	FailedTimeout     uint64 `json:"failed_timeout"`
	FailedReset       uint64 `json:"failed_reset"`
	FailedUnreachable uint64 `json:"failed_unreachable"`
	// Payload bytes, without SYN/FIN and without retransmitted copies.
	BytesSent     uint64 `json:"bytes_sent"`
	BytesReceived uint64 `json:"bytes_received"`
	// Datagrams (UDP, unix datagram sockets).
	DatagramsSent     uint64 `json:"datagrams_sent"`
	DatagramsReceived uint64 `json:"datagrams_received"`
	// Connect latency, SYN sent to ESTABLISHED, on the client side.
	ConnectLatencyCount uint64 `json:"connect_latency_count"`
	ConnectLatencySumUs uint64 `json:"connect_latency_sum_us"`
	ConnectLatencyMaxUs uint64 `json:"connect_latency_max_us"`
	// TCP health: RSTs sent and received, retransmitted segments.
	ResetsSent     uint64 `json:"resets_sent"`
	ResetsReceived uint64 `json:"resets_received"`
	Retransmits    uint64 `json:"retransmits"`
	// Smoothed RTT (the socket's srtt, as ss -ti shows it) of TCP
	// connections, read where deptrace already reads the socket (at close
	// and at each harvest), never per packet: one sample per read that
	// reports the connection's bytes, retransmissions or open (an idle
	// connection's drain and a connection that moved no byte give none;
	// neither does a failed connect). RTTSumUs/RTTSamples is the average;
	// RTTMinUs and RTTMaxUs bound the samples (0 without one).
	RTTSamples uint64 `json:"rtt_samples"`
	RTTSumUs   uint64 `json:"rtt_sum_us"`
	RTTMinUs   uint64 `json:"rtt_min_us"`
	RTTMaxUs   uint64 `json:"rtt_max_us"`
}

// Add accumulates o into c: sums, except the latency maximum.
func (c *Counters) Add(o Counters) {
	c.Connections += o.Connections
	c.FailedConnections += o.FailedConnections
	c.FailedRefused += o.FailedRefused
	c.FailedTimeout += o.FailedTimeout
	c.FailedReset += o.FailedReset
	c.FailedUnreachable += o.FailedUnreachable
	c.BytesSent += o.BytesSent
	c.BytesReceived += o.BytesReceived
	c.DatagramsSent += o.DatagramsSent
	c.DatagramsReceived += o.DatagramsReceived
	c.ConnectLatencyCount += o.ConnectLatencyCount
	c.ConnectLatencySumUs += o.ConnectLatencySumUs
	c.ConnectLatencyMaxUs = max(c.ConnectLatencyMaxUs, o.ConnectLatencyMaxUs)
	c.ResetsSent += o.ResetsSent
	c.ResetsReceived += o.ResetsReceived
	c.Retransmits += o.Retransmits
	if o.RTTSamples > 0 && (c.RTTSamples == 0 || o.RTTMinUs < c.RTTMinUs) {
		c.RTTMinUs = o.RTTMinUs
	}
	c.RTTSamples += o.RTTSamples
	c.RTTSumUs += o.RTTSumUs
	c.RTTMaxUs = max(c.RTTMaxUs, o.RTTMaxUs)
}

// RTTAvgUs is the average smoothed RTT of the samples, 0 without one.
func (c Counters) RTTAvgUs() uint64 {
	if c.RTTSamples == 0 {
		return 0
	}
	return c.RTTSumUs / c.RTTSamples
}

// IsZero reports whether nothing was counted.
func (c Counters) IsZero() bool { return c == Counters{} }

// Unhealthy reports whether anything went wrong on the dependency: failed
// opens, resets or retransmissions.
func (c Counters) Unhealthy() bool {
	return c.FailedConnections > 0 || c.ResetsSent > 0 || c.ResetsReceived > 0 || c.Retransmits > 0
}

// Flow is one bundled flow over one interval: every connection and
// datagram between a local address and a remote address for one server
// port, protocol and direction, whatever the client's ephemeral port was.
// It is the one record type every deptrace producer and consumer shares;
// its JSON form is documented in docs/flows.md.
type Flow struct {
	// Kind is always KindFlow; it tells flows from listeners in jsonl.
	Kind string `json:"kind"`
	// Time is the end of the interval the counters cover.
	Time time.Time `json:"time"`
	// NetNS is the inode number of the network namespace of the local end.
	NetNS uint32 `json:"netns"`
	// Proto is "tcp", "udp" or "unix".
	Proto Proto `json:"proto"`
	// Direction is "outbound" (local end is the client) or "inbound".
	Direction Direction `json:"direction"`
	// LocalAddr and RemoteAddr are IP addresses for tcp and udp; for unix
	// they are socket paths (abstract names as "@name", "" when unnamed).
	LocalAddr  string `json:"local_addr"`
	RemoteAddr string `json:"remote_addr"`
	// Port is the server port: the remote port of an outbound flow, the
	// local port of an inbound one; 0 for unix.
	Port uint16 `json:"port"`
	// PID and Comm name the local process (thread-group id and the
	// process's command name, not a thread's); 0 and "" when unknown.
	PID      uint32 `json:"pid"`
	Comm     string `json:"comm"`
	CgroupID uint64 `json:"cgroup_id"`
	// Identity names the local end the way operators do (systemd unit,
	// container, Kubernetes pod and workload). Every field is omitted for
	// a plain host process; it is filled by deptrace's identity resolver,
	// not by the Tracer itself.
	Identity
	// RemoteName is the DNS name the local end's namespace asked for and
	// got RemoteAddr in an answer (A/AAAA, after CNAMEs), while that
	// answer's TTL ran; empty when no answer named it. Outbound tcp and
	// udp flows only; filled by deptrace's DNS watcher, not the Tracer.
	RemoteName string `json:"remote_name,omitempty"`
	// PeerPID and PeerComm name the process at the other end when the
	// kernel knows it (unix sockets); 0 and "" otherwise.
	PeerPID  uint32 `json:"peer_pid,omitempty"`
	PeerComm string `json:"peer_comm,omitempty"`
	Counters
	// FirstSeen and LastSeen bound the events of this interval.
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// Identity is what the local end of a flow is, beyond its process: the
// systemd unit, the container and the Kubernetes pod and workload it runs
// in, found from its cgroup and the container runtimes' own APIs. Fields
// are empty (and absent in JSON) where they do not apply: all of them for
// a plain host process.
type Identity struct {
	// Unit is the systemd unit of a process outside containers
	// ("nginx.service", "session-3.scope").
	Unit string `json:"unit,omitempty"`
	// ContainerID is the full container id (64 hex digits for Docker,
	// containerd, CRI-O and podman).
	ContainerID string `json:"container_id,omitempty"`
	// ContainerName is the runtime's name of the container (Docker's
	// name without the leading slash; the CRI container's name).
	ContainerName string `json:"container_name,omitempty"`
	// ContainerImage is the image the container was started from, as
	// the user named it.
	ContainerImage string `json:"container_image,omitempty"`
	// ContainerRuntime is "docker", "containerd", "cri-o" or "podman".
	ContainerRuntime string `json:"container_runtime,omitempty"`
	// PodNamespace, PodName, PodUID and K8sContainer come from the labels
	// kubelet sets on every CRI container.
	PodNamespace string `json:"pod_namespace,omitempty"`
	PodName      string `json:"pod_name,omitempty"`
	PodUID       string `json:"pod_uid,omitempty"`
	K8sContainer string `json:"k8s_container,omitempty"`
	// Workload is "kind/name" of what runs the container:
	// "compose/<project>/<service>" for Docker Compose, "Deployment/x",
	// "StatefulSet/x", "DaemonSet/x", "Job/x" or "Pod/x" for Kubernetes.
	Workload string `json:"workload,omitempty"`
}

// Empty reports whether nothing is known beyond the process.
func (id Identity) Empty() bool { return id == Identity{} }

// Label is a short name for people: the Kubernetes pod and container
// ("checkout-7d4b9-x2x4k:app"), else the container's name, else the
// systemd unit; "" for a plain host process.
func (id Identity) Label() string {
	switch {
	case id.PodName != "" && id.K8sContainer != "":
		return id.PodName + ":" + id.K8sContainer
	case id.PodName != "":
		return id.PodName
	case id.ContainerName != "":
		return id.ContainerName
	case id.ContainerID != "":
		return id.ContainerID[:min(12, len(id.ContainerID))]
	}
	return id.Unit
}

// IsUnix reports whether the flow is between unix-domain sockets.
func (f Flow) IsUnix() bool { return f.Proto == ProtoUnix }

// LocalIP and RemoteIP parse the addresses of a tcp or udp flow; invalid
// for unix flows.
func (f Flow) LocalIP() netip.Addr  { a, _ := netip.ParseAddr(f.LocalAddr); return a }
func (f Flow) RemoteIP() netip.Addr { a, _ := netip.ParseAddr(f.RemoteAddr); return a }

// Server is the server end of the dependency: "addr:port" for tcp and udp
// (brackets around IPv6), the socket path for unix.
func (f Flow) Server() string {
	if f.IsUnix() {
		if f.Direction == Inbound {
			return f.LocalAddr
		}
		return f.RemoteAddr
	}
	return f.ServerAddr().String()
}

// ServerAddr is the server end of a tcp or udp dependency; invalid for
// unix flows.
func (f Flow) ServerAddr() netip.AddrPort {
	if f.Direction == Inbound {
		return netip.AddrPortFrom(f.LocalIP(), f.Port)
	}
	return netip.AddrPortFrom(f.RemoteIP(), f.Port)
}

// ClientAddr is the client host of the dependency ("" for unix).
func (f Flow) ClientAddr() string {
	if f.IsUnix() {
		return ""
	}
	if f.Direction == Inbound {
		return f.RemoteAddr
	}
	return f.LocalAddr
}

// Listener is the state of one listening TCP socket over one interval:
// how deep its accept queue got and how many connections it dropped
// because the queue was full.
type Listener struct {
	// Kind is always KindListener.
	Kind      string    `json:"kind"`
	Time      time.Time `json:"time"`
	NetNS     uint32    `json:"netns"`
	Proto     Proto     `json:"proto"`
	LocalAddr string    `json:"local_addr"`
	Port      uint16    `json:"port"`
	PID       uint32    `json:"pid"`
	Comm      string    `json:"comm"`
	// BacklogLimit is the listen() backlog (sk_max_ack_backlog).
	BacklogLimit uint32 `json:"backlog_limit"`
	// QueueMax is the deepest accept queue seen in the interval.
	QueueMax uint32 `json:"queue_max"`
	// Drops counts SYNs and completed handshakes dropped in the interval
	// because the queue was full.
	Drops uint64 `json:"drops"`
}
