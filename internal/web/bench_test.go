package web

// Benchmarks of deptrace serve on 10,000 nodes and 50,000 edges with a
// day of history (the generator follows internal/store's benchmark):
//
//	go test -run '^$' -bench . -benchtime 3x -timeout 30m ./internal/web/
//
// Results are written down in docs/performance.md.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deptrace/deptrace/internal/browsertest"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

func benchAddr(h int) string { return fmt.Sprintf("10.%d.%d.1", h/256, h%256) }

// history writes hosts hosts, each with one client process and three
// services, each client using fanout services elsewhere, every edge active
// once an hour for hours hours, the newest 30 minutes ago (so that "last
// 1 h" holds the whole graph once and "last 24 h" holds it 24 times).
// 2,500 hosts with fanout 20 make 10,000 nodes and 50,000 edges.
func history(tb testing.TB, path string, now time.Time, hosts, fanout, hours int) {
	tb.Helper()
	ctx := context.Background()
	s, err := store.Open(ctx, path)
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close()
	ports := []uint16{80, 5432, 6379}
	procs := []string{"nginx", "postgres", "redis-server"}
	var hb store.Batch
	for h := 0; h < hosts; h++ {
		hb.Hosts = append(hb.Hosts, store.Host{ID: fmt.Sprintf("h%d", h), Name: fmt.Sprintf("h%d", h), Addrs: []string{benchAddr(h)}, LastSeen: now})
	}
	if err := s.Write(ctx, hb); err != nil {
		tb.Fatal(err)
	}
	for hour := hours; hour >= 1; hour-- {
		at := now.Add(-time.Duration(hour)*time.Hour + 30*time.Minute)
		for first := 0; first < hosts; first += 250 {
			var batch store.Batch
			for h := first; h < min(first+250, hosts); h++ {
				for k := 0; k < fanout; k++ {
					peer := (h + 1 + k*97) % hosts
					svc := k % 3
					failed := uint64(0)
					if (h+k)%50 == 0 {
						failed = 3 // a few unhealthy edges to colour (3 of 8 attempts)
					}
					batch.Observations = append(batch.Observations,
						store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", h), Direction: "outbound", Proto: "tcp",
							LocalAddr: benchAddr(h), RemoteAddr: benchAddr(peer), Port: ports[svc], Comm: "app",
							Counters: tracer.Counters{Connections: 5, FailedConnections: failed, BytesSent: 500, BytesReceived: 5000}, FirstSeen: at, LastSeen: at.Add(time.Second)})
					if k < 3 { // the service's own view names its process
						batch.Observations = append(batch.Observations,
							store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: fmt.Sprintf("h%d", peer), Direction: "inbound", Proto: "tcp",
								LocalAddr: benchAddr(peer), RemoteAddr: benchAddr(h), Port: ports[svc], Comm: procs[svc],
								Counters: tracer.Counters{Connections: 5, BytesSent: 5000, BytesReceived: 500}, FirstSeen: at, LastSeen: at.Add(time.Second)})
					}
				}
			}
			if err := s.Write(ctx, batch); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

func BenchmarkServeDay(b *testing.B) {
	path := b.TempDir() + "/bench.db"
	// "Now" is 12:30 UTC today, as in internal/store's benchmarks, so
	// that "last 24 h" splits the same way into minute, hourly and daily
	// rows in every run: 11 hourly rows of yesterday and today's daily
	// row per flow.
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12*time.Hour + 30*time.Minute)
	t0 := time.Now()
	history(b, path, now, 2500, 20, 24)
	b.Logf("loaded a day of history (10,000 nodes, 50,000 edges) in %s", time.Since(t0).Round(time.Millisecond))
	srv, st := serve(b, path, Options{Now: func() time.Time { return now }})
	// As deptrace serve does (--cache-mb), with the benchmark's clock.
	cache := store.CacheConfig{Now: func() time.Time { return now }}
	b.Run("api-graph-24h-cache-fill", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			st.EnableCache(cache) // a fresh, empty cache
			resp, err := http.Get(srv.URL + "/api/graph?since=24h")
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})

	api := func(name, query string, gzip bool) {
		b.Run(name, func(b *testing.B) {
			tr := &http.Transport{DisableCompression: !gzip}
			defer tr.CloseIdleConnections()
			var size int
			for i := 0; i < b.N; i++ {
				resp, err := (&http.Client{Transport: tr}).Get(srv.URL + "/api/graph?" + query)
				if err != nil {
					b.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					b.Fatalf("%d %v %.200s", resp.StatusCode, err, body)
				}
				size = len(body)
			}
			b.ReportMetric(float64(size)/1e6, "MB-json")
		})
	}
	api("api-graph-24h", "since=24h", false)
	api("api-graph-24h-gzip", "since=24h", true)
	api("api-graph-1h", "since=1h", false)

	ctx := browsertest.Browser(b, 30*time.Minute)
	page := func(name, query, view string) {
		b.Run(name, func(b *testing.B) {
			var inPage float64
			for i := 0; i < b.N; i++ {
				if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
					b.Fatal(err)
				}
				if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?"+query), chromedp.WaitVisible(chromedp.CSS(`body[data-state="ready"]`))); err != nil {
					b.Fatal(err)
				}
				got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.dataset.view + ' ' + document.body.dataset.readyMs + ' ' + (document.querySelector('#map').dataset.nodes||'') + ' ' + document.querySelector('#status').textContent`))
				if err != nil {
					b.Fatal(err)
				}
				var v string
				var ms float64
				_, _ = fmt.Sscanf(got, "%s %g", &v, &ms) // v is checked next
				if v != view {
					b.Fatalf("page opened on %q, want %q (%s)", v, view, got)
				}
				inPage += ms
			}
			b.ReportMetric(inPage/float64(b.N)/1000, "s-to-ready")
		})
	}
	page("page-1h-default", "", "table")
	page("page-1h-map", "view=map", "map")
	page("page-24h-default", "range=24h", "table")
	page("page-24h-map", "range=24h&view=map", "map")
}

// BenchmarkPage measures the page in Chromium on a real store: time to
// interactive (the first frame drawn with the data, data-ready-ms) and,
// on the map, time until the worker's layered layout is drawn
// (data-layered-ms), both from navigation start:
//
//	go test -run '^$' -bench BenchmarkPage -benchtime 3x -timeout 30m ./internal/web/
//
// map-2000: 2,000 workloads (500 hosts of a client and three servers)
// and 10,000 edges, which the map opens on with every group expanded
// (groups=expanded: by itself it would open on its 500 groups); table-50000: 10,000
// workloads and 50,000 edges, beyond 2,000 nodes, which the table opens
// on (and sorts). Results are written down in docs/web.md.
func BenchmarkPage(b *testing.B) {
	ctx := browsertest.Browser(b, 30*time.Minute)
	run := func(name string, hosts int, check func(b *testing.B, ctx context.Context)) {
		path := b.TempDir() + "/page.db"
		history(b, path, time.Now(), hosts, 20, 1)
		srv, _ := serve(b, path, Options{})
		b.Run(name, func(b *testing.B) {
			var ready, layered float64
			for i := 0; i < b.N; i++ {
				if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
					b.Fatal(err)
				}
				if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?groups=expanded"), chromedp.WaitVisible(chromedp.CSS(`body[data-state="ready"]`))); err != nil {
					b.Fatal(err)
				}
				ms, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`Number(document.body.dataset.readyMs)`))
				if err != nil {
					b.Fatal(err)
				}
				ready += ms
				check(b, ctx)
				if ms, err = chromedp.Run(ctx, chromedp.Evaluate[float64](`Number(document.body.dataset.layeredMs || 0)`)); err != nil {
					b.Fatal(err)
				}
				layered += ms
			}
			b.ReportMetric(ready/float64(b.N)/1000, "s-to-interactive")
			if layered > 0 {
				b.ReportMetric(layered/float64(b.N)/1000, "s-to-layered")
			}
		})
	}
	run("map-2000", 500, func(b *testing.B, ctx context.Context) {
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelector('#map').dataset.layout === 'layered'`, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
			b.Fatal(err)
		}
		d, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](`Object.assign({view: document.body.dataset.view}, document.querySelector('#map').dataset)`))
		if err != nil || d["view"] != "map" || d["nodes"] != "2000" || d["edges"] != "10000" {
			b.Fatalf("map %v %v: want 2,000 nodes and 10,000 edges", d, err)
		}
	})
	run("table-50000", 2500, func(b *testing.B, ctx context.Context) {
		d, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](`Object.assign({view: document.body.dataset.view}, document.querySelector('#edges').dataset)`))
		if err != nil || d["view"] != "table" || d["rows"] != "50000" || d["shown"] != "500" {
			b.Fatalf("table %v %v: want 50,000 rows, 500 shown", d, err)
		}
		// Sorting all of them answers too.
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`th button[data-sort="connections"]`))); err != nil {
			b.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`location.search.includes('sort=connections')`)); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkNodeSeriesDNS measures a node's history of 24 hours in 120
// points on 500 hosts (2,000 workloads, 2,500 edges an hour) where every
// client resolves names each hour, an edge's history over the same range,
// and, apart, the part of the node's the DNS rows take (one store.DNS
// read per step):
//
//	go test -run '^$' -bench NodeSeriesDNS -benchtime 3x ./internal/web/
func BenchmarkNodeSeriesDNS(b *testing.B) {
	path := b.TempDir() + "/series.db"
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12*time.Hour + 30*time.Minute)
	const hosts = 500
	history(b, path, now, hosts, 5, 24)
	st, err := store.Open(context.Background(), path)
	if err != nil {
		b.Fatal(err)
	}
	for hour := 24; hour >= 1; hour-- {
		at := now.Add(-time.Duration(hour)*time.Hour + 30*time.Minute)
		var batch store.Batch
		for h := 0; h < hosts; h++ {
			batch.DNS = append(batch.DNS, store.DNSObservation{Bucket: at.Truncate(time.Minute), HostID: fmt.Sprintf("h%d", h), Comm: "app", PID: 7,
				Proto: "udp", Resolver: "127.0.0.53:53", DNSCounters: tracer.DNSCounters{Queries: 20, Answers: 19, NoError: 19, Timeouts: 1,
					LatencyCount: 19, LatencySumUs: 19000, LatencyMaxUs: 4000}, FirstSeen: at, LastSeen: at})
		}
		if err := st.Write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
	st.Close()
	srv, st := serve(b, path, Options{Now: func() time.Time { return now }})
	b.Run("api-series-node-24h-120-points", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var ans nodeSeriesAnswer
			code, err := getJSON(b, srv.URL+"/api/series?since=24h&points=120&node=workload:h0/app", &ans)
			var q uint64
			for _, p := range ans.Points {
				if p.DNS != nil {
					q += p.DNS.Queries
				}
			}
			if err != nil || code != 200 || q != 24*20 {
				b.Fatalf("%d %v: %d queries in the series, want %d", code, err, q, 24*20)
			}
		}
	})
	// An edge's history over the same range: h0's app -> h1's nginx,
	// 5 connections an hour.
	b.Run("api-series-edge-24h-120-points", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var ans seriesAnswer
			code, err := getJSON(b, srv.URL+"/api/series?since=24h&points=120&proto=tcp&port=80&from=workload:h0/app&to=workload:h1/nginx", &ans)
			var c uint64
			for _, p := range ans.Points {
				c += p.Connections
			}
			if err != nil || code != 200 || c != 24*5 {
				b.Fatalf("%d %v: %d connections in the series, want %d", code, err, c, 24*5)
			}
		}
	})
	// The DNS reads of its 121 steps (store.DNS, as the series reads them).
	b.Run("dns-reads-of-its-steps", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			for t := now.Add(-24 * time.Hour).Truncate(time.Minute); t.Before(now); t = t.Add(12 * time.Minute) {
				if _, err := st.DNS(context.Background(), store.Range{Since: t, Until: t.Add(12 * time.Minute)}); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkSeriesIdleNode measures /api/series of a node the store holds
// that had no traffic in the range (the last 20 minutes; every edge of
// history is 30 minutes old at the newest) over two weeks of history on
// 500 hosts (2,000 workloads, 2,500 edges an hour): to tell it from a
// node the store never held, the server reads all history once
// (cold: what every such request cost before the set of ids seen was
// kept; cold-store-cache-empty: the same on a serve just started) and
// answers the next ones from that set (warm):
//
//	go test -run '^$' -bench SeriesIdleNode -benchtime 5x ./internal/web/
func BenchmarkSeriesIdleNode(b *testing.B) {
	path := b.TempDir() + "/idle.db"
	now := time.Now().UTC().Truncate(24 * time.Hour).Add(12*time.Hour + 30*time.Minute)
	t0 := time.Now()
	history(b, path, now, 500, 5, 14*24)
	b.Logf("loaded two weeks of history (2,000 workloads, 2,500 edges an hour) in %s", time.Since(t0).Round(time.Millisecond))
	srv, st := serve(b, path, Options{Now: func() time.Time { return now }})
	seen := &srv.Config.Handler.(*Server).seen
	ask := func(b *testing.B) {
		var ans nodeSeriesAnswer
		code, err := getJSON(b, srv.URL+"/api/series?since=20m&node=workload:h0/app", &ans)
		if err != nil || code != 200 || len(ans.Points) < 20 {
			b.Fatalf("%d %v: %d points, want 20 or 21", code, err, len(ans.Points))
		}
		for _, p := range ans.Points {
			if p.Out.Edges != 0 {
				b.Fatalf("an idle node with traffic: %+v", p)
			}
		}
	}
	// The first request after serve starts: the store's cache of past
	// hours and days empty too.
	b.Run("cold-store-cache-empty", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			st.EnableCache(store.CacheConfig{Now: func() time.Time { return now }})
			seen.put(graph.ByWorkload, nil)
			ask(b)
		}
	})
	ask(b) // the store's cache filled, as on a serve that has been running
	b.Run("cold", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			seen.put(graph.ByWorkload, nil)
			ask(b)
		}
	})
	b.Run("warm", func(b *testing.B) {
		ask(b)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			ask(b)
		}
	})
}

// getJSON GETs url and decodes its answer into v, giving its status.
func getJSON(b *testing.B, url string, v any) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}
