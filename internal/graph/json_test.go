package graph

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/deptrace/deptrace/tracer"
)

// The hand-written JSON is encoding/json's, byte for byte, on every field
// and on strings that need escaping.
func TestJSONMatchesEncodingJSON(t *testing.T) {
	at := time.Date(2026, 11, 22, 7, 30, 1, 123456789, time.UTC)
	graphs := []Graph{
		{},
		{Nodes: []Node{}, Edges: []Edge{}},
		{
			Nodes: []Node{
				{ID: "process:h1/app", Kind: KindProcess, Host: "h1", Addr: "10.0.0.1", Process: "app"},
				{ID: "service:h2/tcp/5432", Kind: KindService, Host: "h2", Addr: "10.0.0.2", Port: 5432, Proto: "tcp", Process: "postgres",
					Listener: &ListenerState{BacklogLimit: 4096, QueueMax: 129, Drops: 7}, Unhealthy: true, Reasons: []string{"accept queue full: 7 handshake packets dropped"}},
				{ID: "service:h2/unix:/run/a<b>&\"c\\\n", Kind: KindService, Host: "h2", Addr: "/run/é\u2028\xff", Proto: "unix", Process: "ünïcode"},
				{ID: "process:h3/nginx", Kind: KindProcess, Host: "h3", Process: "nginx", Identity: tracer.Identity{Unit: "nginx.service"}},
				{ID: "service:h4/tcp/80", Kind: KindService, Host: "h4", Port: 80, Proto: "tcp", Process: "app", Identity: tracer.Identity{
					ContainerID: "4f1c", ContainerName: "app<\"1\">", ContainerImage: "registry.local/checkout:1.4", ContainerRuntime: "containerd",
					PodNamespace: "shop", PodName: "checkout-7d4b9c-x2x4k", PodUID: "0e6b", K8sContainer: "app", Workload: "Deployment/checkout"},
					Listener: &ListenerState{BacklogLimit: 1}},
				{ID: "external:[2001:db8::1]:443", Kind: KindExternal, Addr: "2001:db8::1", Port: 443, Proto: "tcp", Listener: &ListenerState{}},
				{ID: "service:h5/tcp/7002", Kind: KindService, Host: "h5", Port: 7002, Proto: "tcp", Unhealthy: true, Health: HealthUnhealthy, Unanswered: true},
			},
			Edges: []Edge{
				{From: "process:h1/app", To: "service:h2/tcp/5432", Proto: "tcp", Port: 5432,
					Counters: tracer.Counters{Connections: 1, FailedConnections: 2, FailedRefused: 3, FailedTimeout: 4, FailedReset: 5, FailedUnreachable: 6,
						BytesSent: 7, BytesReceived: 1 << 63, DatagramsSent: 9, DatagramsReceived: 10, ConnectLatencyCount: 11, ConnectLatencySumUs: 12,
						ConnectLatencyMaxUs: 13, ResetsSent: 14, ResetsReceived: 15, Retransmits: 16},
					ConnectLatencyAvgUs: 1, FirstSeen: at, LastSeen: at.Add(time.Second), Unhealthy: true, Reasons: []string{"a", "b <c>"}},
				{From: "x", To: "y", Proto: "unix", Addrs: []string{"/run/a.sock", "@b<\"c\">"}, FirstSeen: at.Truncate(time.Second), LastSeen: at.In(time.FixedZone("x", 3600))},
				{From: "z", To: "w"},
			},
		},
		{
			Format: 2,
			Nodes: []Node{
				{ID: "workload:h2/Deployment/db", Kind: KindWorkload, Host: "h2", Addr: "10.0.0.2", Process: "pgbouncer,postgres", Name: "Deployment/db",
					Processes: []string{"pgbouncer", "postgres"}, Identity: tracer.Identity{PodNamespace: "shop", Workload: "Deployment/db"},
					Services: []Service{
						{Proto: "tcp", Port: 5432, Process: "postgres", Listener: &ListenerState{BacklogLimit: 4096, QueueMax: 129, Drops: 7}, Unhealthy: true, Reasons: []string{"7 dropped", "<x>"}},
						{Proto: "unix", Addr: "/run/a\"b", Process: "pgbouncer"},
						{Proto: "tcp", Port: 7002, Unhealthy: true, Reasons: []string{"nothing answered"}, Health: HealthUnhealthy, Unanswered: true},
					},
					Unhealthy: true, Reasons: []string{"tcp/5432: 7 dropped"}},
				{ID: "host:h1", Kind: KindHost, Host: "h1", Name: "h1", Process: "app", DNS: []DNSStats{
					{Proto: "udp", Resolver: "127.0.0.53:53", DNSCounters: tracer.DNSCounters{Queries: 1, Answers: 2, NoError: 3, NXDomain: 4, ServFail: 5,
						OtherErrors: 6, Timeouts: 7, LatencyCount: 8, LatencySumUs: 9, LatencyMaxUs: 10, Unparsed: 11}, LatencyAvgUs: 12, FailedLookups: 13,
						Reasons: []string{"6 of 10 lookups <failed>", "b"}, Health: HealthUnhealthy},
					{Proto: "tcp", Resolver: "[2001:db8::53]:53"},
				}, Unhealthy: true, Reasons: []string{"DNS via x: y"}},
				{ID: "external:203.0.113.7:443", Kind: KindExternal, Addr: "203.0.113.7", Port: 443, Proto: "tcp", Name: "api.example.com", RemoteName: "api.example.com"},
			},
			Edges: []Edge{{From: "host:h1", To: "workload:h2/Deployment/db", Proto: "tcp", Port: 5432},
				{From: "host:h1", To: "external:203.0.113.7:443", Proto: "tcp", Port: 443, Counters: tracer.Counters{RTTSamples: 2, RTTSumUs: 3, RTTMinUs: 1, RTTMaxUs: 2}, RTTAvgUs: 1}},
		},
	}
	for i, g := range graphs {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetIndent("", "  ")
		if err := enc.Encode(g); err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := Write(&got, g, "json"); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("graph %d: got\n%s\nwant\n%s", i, got.Bytes(), want.Bytes())
		}
		m, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		got.Reset()
		if err := WriteCompactJSON(&got, g); err != nil {
			t.Fatal(err)
		}
		if want := append(m, '\n'); !bytes.Equal(got.Bytes(), want) {
			t.Errorf("graph %d, compact: got\n%s\nwant\n%s", i, got.Bytes(), want)
		}
	}
}
