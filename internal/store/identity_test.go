package store_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

var (
	checkoutID = tracer.Identity{ContainerID: "4f1c0ffee0000000000000000000000000000000000000000000000000000001", ContainerName: "app",
		ContainerImage: "registry.local/checkout:1.4", ContainerRuntime: "containerd", PodNamespace: "shop",
		PodName: "checkout-7d4b9c-x2x4k", PodUID: "0e6b1c2d-0000-4000-8000-000000000001", K8sContainer: "app", Workload: "Deployment/checkout"}
	nginxUnit = tracer.Identity{Unit: "nginx.service"}
)

// identityBatch is fleet's dataset with identities: the client is a
// Kubernetes pod's container, web's nginx a systemd unit, db a plain
// process; and a short-lived client namespace whose address nobody read
// (its host has none) but its flow shows.
func identityBatch(at time.Time) store.Batch {
	b := fleet(at)
	b.Observations[0].Identity = checkoutID
	b.Observations[1].Identity = nginxUnit
	b.Observations[2].Identity = nginxUnit
	b.Hosts = append(b.Hosts, store.Host{ID: "job", Name: "job", NetNS: 4, LastSeen: at})
	b.Observations = append(b.Observations, obs("job", "outbound", "198.51.100.9", "198.51.100.2", 80, "wget", at, 1, 10),
		obs("web", "inbound", "198.51.100.2", "198.51.100.9", 80, "nginx", at, 1, 90))
	b.Observations[5].Identity = tracer.Identity{ContainerID: "0b5e", ContainerName: "oneshot", ContainerImage: "busybox", ContainerRuntime: "docker"}
	b.Observations[6].Identity = nginxUnit
	return b
}

// Identities are written per host and process on ingest and read back
// for the range they were seen in; local addresses are learnt from the
// flows, for the hosts that had none.
func TestIdentitiesRoundTrip(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			if err := s.Write(ctx, identityBatch(t0)); err != nil {
				t.Fatal(err)
			}
			later := t0.Add(10 * time.Minute)
			moved := checkoutID
			moved.ContainerName = "app-renamed"
			if err := s.Write(ctx, store.Batch{Hosts: []store.Host{{ID: "client", Name: "client", NetNS: 1, LastSeen: later}},
				Observations: []store.Observation{func() store.Observation {
					o := obs("client", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", later, 1, 1)
					o.Identity = moved
					return o
				}()}}); err != nil {
				t.Fatal(err)
			}
			got, err := s.Identities(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			want := []store.EndIdentity{
				{HostID: "client", Comm: "curl", Identity: moved, FirstSeen: t0, LastSeen: later.Add(time.Second)},
				{HostID: "job", Comm: "wget", Identity: identityBatch(t0).Observations[5].Identity, FirstSeen: t0, LastSeen: t0.Add(time.Second)},
				{HostID: "web", Comm: "nginx", Identity: nginxUnit, FirstSeen: t0, LastSeen: t0.Add(time.Second)},
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("identities:\n got %+v\nwant %+v", got, want)
			}
			// A range after the first write sees only what was seen in it.
			got, err = s.Identities(ctx, store.Range{Since: t0.Add(5 * time.Minute)})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Comm != "curl" || got[0].ContainerName != "app-renamed" {
				t.Errorf("identities since t0+5m: %+v", got)
			}
			hosts, err := s.Hosts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(hosts, func(h store.Host) bool { return h.ID == "job" })
			if i < 0 || !reflect.DeepEqual(hosts[i].Addrs, []string{"198.51.100.9"}) {
				t.Fatalf("the job host's addresses learnt from its flow: %+v", hosts)
			}
			// Observations read back carry no identity (it is per end).
			os, err := s.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range os {
				if !o.Identity.Empty() {
					t.Errorf("observation carries an identity: %+v", o)
				}
			}
			// Retention forgets identities with the rest.
			if _, err := s.Retain(ctx, t0.Add(48*time.Hour), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			if got, err := s.Identities(ctx, store.Range{}); err != nil || len(got) != 0 {
				t.Errorf("after retention: %+v, %v", got, err)
			}
		})
	}
}

// Retain keeps the day row its cutoff falls in, so it keeps the names of
// that day's ends too (identities, learnt addresses, services): a later
// read of the day row names them. They go with the day.
func TestRetainKeepsTheNamesOfTheDayItKeeps(t *testing.T) {
	ctx := context.Background()
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			if err := s.Write(ctx, identityBatch(day.Add(time.Hour))); err != nil {
				t.Fatal(err)
			}
			names := func() (ids, services int, jobAddrs []string) {
				got, err := s.Identities(ctx, store.Range{})
				if err != nil {
					t.Fatal(err)
				}
				svcs, err := s.Services(ctx, store.Range{})
				if err != nil {
					t.Fatal(err)
				}
				hosts, err := s.Hosts(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, h := range hosts {
					if h.ID == "job" {
						jobAddrs = h.Addrs
					}
				}
				return len(got), len(svcs), jobAddrs
			}
			if _, err := s.Retain(ctx, day.Add(12*time.Hour), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			if ids, svcs, addrs := names(); ids != 3 || svcs != 1 || len(addrs) != 1 {
				t.Errorf("cut at noon of the day kept: %d identities, %d services, job's addresses %v; want 3, 1 and one address", ids, svcs, addrs)
			}
			if _, err := s.Retain(ctx, day.Add(36*time.Hour), store.DefaultBucket); err != nil {
				t.Fatal(err)
			}
			if ids, svcs, addrs := names(); ids != 0 || svcs != 0 || len(addrs) != 0 {
				t.Errorf("cut the next day: %d identities, %d services, job's addresses %v; want none", ids, svcs, addrs)
			}
			if hosts, err := s.Hosts(ctx); err != nil || len(hosts) != 0 {
				t.Errorf("cut the next day: hosts %+v %v; want none (none seen since)", hosts, err)
			}
		})
	}
}

// A store of schema 9 (before identities) opens, migrates and keeps its
// flows; identities written after the upgrade are read back.
func TestUpgradeToIdentities(t *testing.T) {
	ctx := context.Background()
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := quiet(t, spec)
			if err := s.Write(ctx, fleet(t0)); err != nil {
				t.Fatal(err)
			}
			want, err := s.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			undoSchema11(t, s, want)
			for _, q := range []string{`DROP TABLE end_identities`, `DELETE FROM schema_version WHERE version >= 10`} {
				if _, err := s.DB().ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if v, err := s.Version(ctx); err != nil || v != 9 {
				t.Fatalf("made schema %d (%v), want 9", v, err)
			}
			s.Close()

			u := quiet(t, spec)
			if v, err := u.Version(ctx); err != nil || v != store.SchemaVersion || v < 10 {
				t.Fatalf("after upgrade: schema %d (%v), want %d", v, err, store.SchemaVersion)
			}
			got, err := u.Observations(ctx, store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("after the upgrade %d flows, before %d, or different counters", len(got), len(want))
			}
			if ids, err := u.Identities(ctx, store.Range{}); err != nil || len(ids) != 0 {
				t.Errorf("identities of flows stored before the upgrade: %+v, %v", ids, err)
			}
			if err := u.Write(ctx, identityBatch(t0.Add(time.Hour))); err != nil {
				t.Fatal(err)
			}
			ids, err := u.Identities(ctx, store.Range{})
			if err != nil || len(ids) != 3 || ids[0].Workload != "Deployment/checkout" {
				t.Errorf("identities written after the upgrade: %+v, %v", ids, err)
			}
		})
	}
}

// A host's address keeps its latest sighting: a batch replayed from the
// spool, older than what was stored since, does not move it back (the
// graph places an address several hosts held one after another by it).
func TestHostAddressKeepsItsLatestSighting(t *testing.T) {
	ctx := context.Background()
	t1 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	t2 := t1.Add(time.Hour)
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			for i, at := range []time.Time{t2, t1} {
				b := store.Batch{ID: fmt.Sprintf("b%d", i), Hosts: []store.Host{{ID: "h", Addrs: []string{"198.51.100.7"}, LastSeen: at}}}
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			hosts, err := s.Hosts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(hosts) != 1 || len(hosts[0].AddrsSeen) != 1 || !hosts[0].AddrsSeen[0].Equal(t2) {
				t.Errorf("hosts %+v; want h's address last seen at %s", hosts, t2)
			}
		})
	}
}

// A batch replayed from the spool after a newer one (t2, then t1) widens
// a host's and a service's first and last seen, so a range of the older
// hour finds the service, but does not put back the host's older name and
// netns; a newer batch (t3) still renames it.
func TestReplayedBatchDoesNotMoveAHostOrServiceBack(t *testing.T) {
	t1 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	t2, t3 := t1.Add(time.Hour), t1.Add(2*time.Hour)
	sighting := func(id string, at time.Time, netns uint32) store.Batch {
		return store.Batch{ID: id, Hosts: []store.Host{{ID: "h", Name: fmt.Sprint("web-", netns), NetNS: netns, LastSeen: at}},
			Services: []store.Service{{HostID: "h", Proto: "tcp", Port: 80, Comm: "nginx", LastSeen: at}}}
	}
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			write(t, s, sighting("b2", t2, 2), sighting("b1", t1, 1))
			checkHost(t, s, "web-2", 2, t1, t2)
			for what, r := range map[string]store.Range{"all time": {}, "the older sighting's half hour": {Since: t1, Until: t1.Add(30 * time.Minute)}} {
				svcs, err := s.Services(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				if len(svcs) != 1 || !svcs[0].LastSeen.Equal(t2) {
					t.Errorf("services of %s: %+v; want nginx on h last seen at %s", what, svcs, t2)
				}
			}
			write(t, s, sighting("b3", t3, 3))
			checkHost(t, s, "web-3", 3, t1, t3)
		})
	}
}

// write writes batches into s in order.
func write(t *testing.T, s *store.Store, batches ...store.Batch) {
	t.Helper()
	for _, b := range batches {
		if err := s.Write(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
}

// checkHost checks the one host h: its name and netns, and its first and
// last seen as stored (Hosts does not read first seen).
func checkHost(t *testing.T, s *store.Store, name string, netns uint32, first, last time.Time) {
	t.Helper()
	hosts, err := s.Hosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(hosts) != 1 || hosts[0].Name != name || hosts[0].NetNS != netns || !hosts[0].LastSeen.Equal(last) {
		t.Errorf("hosts %+v; want h named %s in netns %d, last seen %s", hosts, name, netns, last)
	}
	var f int64
	if err := s.DB().QueryRow(`SELECT first_seen FROM hosts WHERE id = 'h'`).Scan(&f); err != nil {
		t.Fatal(err)
	}
	if got := time.Unix(0, f).UTC(); !got.Equal(first) {
		t.Errorf("h first seen %s, want %s", got, first)
	}
}

// A replayed batch (older, from the spool) does not put back the name a
// container had before a rename: an end's names are its latest
// sighting's.
func TestReplayedBatchKeepsAnEndsLatestNames(t *testing.T) {
	t1 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	t2 := t1.Add(time.Hour)
	named := func(id, name string, at time.Time) store.Batch {
		o := obs("h", "outbound", "198.51.100.1", "198.51.100.2", 80, "curl", at, 1, 10)
		o.Identity = tracer.Identity{ContainerID: "c0ffee0123456789", ContainerName: name, ContainerRuntime: "docker", Workload: "compose/shop/" + name}
		return store.Batch{ID: id, Observations: []store.Observation{o}}
	}
	for name, spec := range backends(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t, spec)
			write(t, s, named("b2", "api-renamed", t2), named("b1", "api", t1))
			ids, err := s.Identities(context.Background(), store.Range{})
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != 1 || ids[0].ContainerName != "api-renamed" || ids[0].Workload != "compose/shop/api-renamed" || !ids[0].FirstSeen.Equal(t1) {
				t.Errorf("identities %+v; want the container named api-renamed (its latest), first seen %s", ids, t1)
			}
		})
	}
}
