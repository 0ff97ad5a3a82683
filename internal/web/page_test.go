package web

// Browser tests of what the page shows a user, each for a bug a QA pass
// found: the real page in Debian's chromium-headless-shell against a real
// server over a seeded SQLite store, as in browser_test.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/deptrace/deptrace/internal/browsertest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// text is an element's text as a user reads it, white space folded.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return browsertest.JS[string](t, ctx, `(e => e ? e.innerText.replace(/\s+/g, ' ').trim() : '')(document.querySelector(`+fmt.Sprintf("%q", sel)+`))`)
}

// A custom range is the browser's local time. A browser in
// another zone than the server's (Tokyo, or UTC-5 if the server runs in
// Tokyo's offset) applies "the last 30 minutes" in its own wall-clock
// time: the page sends absolute times and shows the last 30 minutes'
// dependencies, and a link's UTC times read back into the inputs in
// local time.
func TestPageCustomRangeIsLocalTime(t *testing.T) {
	path, now := seed(t)
	srv, _ := serve(t, path, Options{})
	zone, offset := "Asia/Tokyo", 9*3600
	if _, off := now.Zone(); off == offset {
		zone, offset = "Etc/GMT+5", -5*3600 // POSIX signs: UTC-5
	}
	local := time.FixedZone(zone, offset)
	ctx := browsertest.BrowserInZone(t, zone, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	if got := browsertest.JS[float64](t, ctx, `new Date().getTimezoneOffset()`); got != float64(-offset/60) {
		t.Fatalf("browser zone offset %v min, want %d (TZ=%s)", got, -offset/60, zone)
	}
	since, until := now.Add(-30*time.Minute).In(local), now.Add(5*time.Minute).In(local)
	browsertest.JS[bool](t, ctx, `(r => { r.value = 'custom'; r.dispatchEvent(new Event('change')); return true; })(document.querySelector('#range'))`)
	browsertest.JS[bool](t, ctx, fmt.Sprintf(`document.querySelector('#since').value = %q, document.querySelector('#until').value = %q, true`,
		since.Format("2006-01-02T15:04"), until.Format("2006-01-02T15:04")))
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#apply-custom"))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `location.search.includes('since=') && document.body.dataset.state === 'ready'`, `[location.search, document.querySelector('#status').innerText]`)
	// The request carries absolute times, the instants the user chose.
	reqs := browsertest.JS[[]string](t, ctx, `performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/api/graph?') && n.includes('since='))`)
	if len(reqs) == 0 {
		t.Fatal("no /api/graph request with since")
	}
	u, err := url.Parse(reqs[len(reqs)-1])
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]time.Time{"since": since.Truncate(time.Minute), "until": until.Truncate(time.Minute)} {
		got, err := time.Parse(time.RFC3339, u.Query().Get(k))
		if err != nil || !got.Equal(want) {
			t.Errorf("request %s=%q (%v): want the absolute time %s", k, u.Query().Get(k), err, want.Format(time.RFC3339))
		}
	}
	// The last 30 minutes: nginx, postgres, redis and the DNS server, 3 edges.
	if d := mapData(t, ctx); d["nodes"] != "4" || d["edges"] != "3" {
		t.Errorf("custom range of the last 30 minutes in %s shows %v (status %q), want 4 nodes and 3 edges", zone, d, text(t, ctx, "#status"))
	}
	// A link with UTC times (and seconds) shows them in the browser's time.
	s2, u2 := now.Add(-40*time.Minute).UTC().Truncate(time.Second), now.UTC().Truncate(time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&since="+s2.Format(time.RFC3339)+"&until="+u2.Format(time.RFC3339))
	inputs := browsertest.JS[[]string](t, ctx, `[document.querySelector('#since').value, document.querySelector('#until').value, document.querySelector('#range').value]`)
	want := []string{s2.In(local).Format("2006-01-02T15:04:05"), u2.In(local).Format("2006-01-02T15:04:05"), "custom"}
	for i := range want {
		// A time on the whole minute is shown without its seconds.
		if inputs[i] != want[i] && inputs[i] != strings.TrimSuffix(want[i], ":00") {
			t.Errorf("inputs %q, want %q (the link's times in %s)", inputs, want, zone)
			break
		}
	}
	if d := mapData(t, ctx); d["nodes"] != "4" {
		t.Errorf("link with UTC times shows %v, want 4 nodes", d)
	}
	// A link in the API's "2006-01-02 15:04" form, without an offset, is
	// the browser's local time too (its space is not an offset's "+").
	s3 := now.Add(-40 * time.Minute).In(local).Truncate(time.Minute)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&since="+url.QueryEscape(s3.Format("2006-01-02 15:04")))
	browsertest.Until(t, ctx, `document.body.dataset.state === 'ready'`, `document.querySelector('#status').innerText`)
	reqs = browsertest.JS[[]string](t, ctx, `performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/api/graph?') && n.includes('since='))`)
	if u, err = url.Parse(reqs[len(reqs)-1]); err != nil {
		t.Fatal(err)
	}
	if got, err := time.Parse(time.RFC3339, u.Query().Get("since")); err != nil || !got.Equal(s3) {
		t.Errorf("link since=%q: request since=%q (%v), want the absolute time %s", s3.Format("2006-01-02 15:04"), u.Query().Get("since"), err, s3.Format(time.RFC3339))
	}
}

// apiGraph is /api/graph's answer, decoded loosely.
type apiGraph struct {
	Nodes []map[string]any `json:"nodes"`
	Edges []map[string]any `json:"edges"`
}

func pageJSON(t *testing.T, u string, v any) {
	t.Helper()
	r, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if r.StatusCode != 200 {
		t.Fatalf("GET %s: %s", u, r.Status)
	}
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// usText formats microseconds as the page does: "814 µs", "2.1 ms", "12 ms".
func usText(v float64) string {
	if v >= 1000 {
		if v >= 10000 {
			return fmt.Sprintf("%.0f ms", v/1000)
		}
		return fmt.Sprintf("%.1f ms", v/1000)
	}
	return fmt.Sprintf("%.0f µs", math.Round(v))
}

// commas writes an integer as the page does (en: 1,320).
func commas(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// A node's details add its edges up as a whole, apart for the
// traffic to it and from it: counters summed, averages from sums and
// counts, maxima as maxima, RTT's minimum the smallest measured; the
// same numbers as /api/graph's edges and its history (/api/series?node=).
func TestPageNodeDetailsAddUp(t *testing.T) {
	at := time.Now().Add(-10 * time.Minute)
	addr := map[string]string{"web-1": "198.51.100.1", "web-2": "198.51.100.2", "api-1": "198.51.100.5", "db-1": "198.51.100.6"}
	b := store.Batch{}
	for h, a := range addr {
		b.Hosts = append(b.Hosts, store.Host{ID: h, Name: h, Addrs: []string{a}, LastSeen: at})
	}
	tcp := func(conns, latCount, latSum, latMax, rttN, rttSum, rttMin, rttMax uint64) tracer.Counters {
		return tracer.Counters{Connections: conns, BytesSent: 300 * conns, BytesReceived: 5000 * conns,
			ConnectLatencyCount: latCount, ConnectLatencySumUs: latSum, ConnectLatencyMaxUs: latMax,
			RTTSamples: rttN, RTTSumUs: rttSum, RTTMinUs: rttMin, RTTMaxUs: rttMax}
	}
	call := func(c, ccomm, s, scomm string, port uint16, cc tracer.Counters) {
		sc := cc
		sc.BytesSent, sc.BytesReceived = cc.BytesReceived, cc.BytesSent
		b.Observations = append(b.Observations, callObservations(at, c, addr[c], ccomm, s, addr[s], scomm, "tcp", port, cc, sc)...)
	}
	// api serves two clients (660 connections each way in all) and calls
	// postgres and a UDP collector.
	call("web-1", "curl", "api-1", "api", 8080, tcp(400, 400, 320000, 2100, 40, 40000, 14, 3000))
	call("web-2", "curl", "api-1", "api", 8080, tcp(260, 250, 250000, 9000, 20, 60000, 204, 5000))
	call("api-1", "api", "db-1", "postgres", 5432, tcp(660, 660, 330000, 1500, 0, 0, 0, 0))
	b.Observations = append(b.Observations, store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: "api-1", Direction: "outbound", Proto: "udp",
		LocalAddr: addr["api-1"], RemoteAddr: "192.0.2.9", Port: 8125, Comm: "api",
		Counters: tracer.Counters{DatagramsSent: 660, BytesSent: 66000}, FirstSeen: at, LastSeen: at.Add(time.Second)})
	srv, _ := serve(t, writeSeed(t, "details.db", b), Options{})
	const api = "workload:api-1/api"

	var g apiGraph
	pageJSON(t, srv.URL+"/api/graph?since=1h", &g)
	type side struct{ conns, dgs, sent, recv, latN, latSum, latMax, rttN, rttSum, rttMin, rttMax float64 }
	var in, out side
	for _, e := range g.Edges {
		f := func(k string) float64 { v, _ := e[k].(float64); return v }
		var s *side
		switch {
		case e["to"] == api:
			s = &in
		case e["from"] == api:
			s = &out
		default:
			continue
		}
		s.conns += f("connections")
		s.dgs += f("datagrams_sent") + f("datagrams_received")
		s.sent += f("bytes_sent")
		s.recv += f("bytes_received")
		s.latN += f("connect_latency_count")
		s.latSum += f("connect_latency_sum_us")
		s.latMax = math.Max(s.latMax, f("connect_latency_max_us"))
		s.rttN += f("rtt_samples")
		s.rttSum += f("rtt_sum_us")
		s.rttMax = math.Max(s.rttMax, f("rtt_max_us"))
		if m := f("rtt_min_us"); f("rtt_samples") > 0 && m > 0 && (s.rttMin == 0 || m < s.rttMin) {
			s.rttMin = m
		}
	}
	if in.conns != 660 || out.conns != 660 || out.dgs != 660 {
		t.Fatalf("the seed's graph: in %+v, out %+v", in, out)
	}
	// The history below the details counts the same connections.
	var series struct {
		Points []struct {
			In, Out struct {
				Connections float64 `json:"connections"`
			}
		} `json:"points"`
	}
	pageJSON(t, srv.URL+"/api/series?since=1h&node="+url.QueryEscape(api), &series)
	var sin, sout float64
	for _, p := range series.Points {
		sin += p.In.Connections
		sout += p.Out.Connections
	}
	if sin != in.conns || sout != out.conns {
		t.Fatalf("series of %s: %v in, %v out; graph %v, %v", api, sin, sout, in.conns, out.conns)
	}

	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	browsertest.JS[bool](t, ctx, `window.deptrace.clickNode('`+api+`'), true`)
	browsertest.Until(t, ctx, `!!document.querySelector('#details [data-traffic="to"]')`, `document.querySelector('#details').innerText`)
	to, from := text(t, ctx, `#details [data-traffic="to"]`), text(t, ctx, `#details [data-traffic="from"]`)
	for _, w := range []string{
		"connections " + commas(in.conns) + " ",
		"connect latency " + usText(in.latSum/in.latN) + " average, " + usText(in.latMax) + " max (" + commas(in.latN) + " connects)",
		"RTT " + usText(in.rttSum/in.rttN) + " average, " + usText(in.rttMin) + " to " + usText(in.rttMax) + " (" + commas(in.rttN) + " samples)",
		"bytes 193.4 KiB sent to it, 3.1 MiB received from it", // 660 × 300 B and 660 × 5,000 B
	} {
		if !strings.Contains(to+" ", w) {
			t.Errorf("traffic to %s lacks %q:\n%s", api, w, to)
		}
	}
	for _, w := range []string{
		"connections " + commas(out.conns) + " ",
		"datagrams 660 sent, 0 received",
		"connect latency " + usText(out.latSum/out.latN) + " average, " + usText(out.latMax) + " max (" + commas(out.latN) + " connects)",
	} {
		if !strings.Contains(from+" ", w) {
			t.Errorf("traffic from %s lacks %q:\n%s", api, w, from)
		}
	}
	screenshot(t, ctx, "node-details")
	details := text(t, ctx, "#details")
	if m := regexp.MustCompile(`\w+ (sum|max|min|avg) us|_us|\bchange\b|1,320`).FindString(details); m != "" {
		t.Errorf("details show %q (raw field names, a change outside diff mode, or in and out added together):\n%s", m, details)
	}
}

// In diff mode an edge keeps its health's colour. The edge to
// redis appeared in the last hour and fails 3 of 8 connects: it is drawn
// red, badged "new", and the legend explains both.
func TestPageDiffKeepsHealth(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=1h&diff=1")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	edge := browsertest.JS[map[string]any](t, ctx, `(G => { const a = G.getEdgeAttributes(G.edge('`+idNginx+`', '`+idRedis+`')); return {color: a.color, status: a.status, label: a.label || ''}; })(window.deptrace.display)`)
	if edge["status"] != "appeared" || edge["color"] != "#e03131" || edge["label"] != "new" {
		t.Errorf("appeared unhealthy edge drawn %v, want red (#e03131) with the badge new", edge)
	}
	img := screenshot(t, ctx, "diff-health")
	if n := pixels(img, 0xe03131); n < 20 {
		t.Errorf("unhealthy red drawn on %d pixels in diff mode", n)
	}
	if l := text(t, ctx, "#legend"); !strings.Contains(l, "unhealthy") || !strings.Contains(l, "new") || !strings.Contains(l, "the colour is the health") {
		t.Errorf("diff legend %q does not say what is drawn", l)
	}
}

// The focus panel gives a UDP dependency's datagrams, not "0 conns".
func TestPageFocusListsDatagrams(t *testing.T) {
	path, _ := seedChain(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&focus="+url.QueryEscape("workload:web-1/nginx"))
	deps := text(t, ctx, "#deps")
	if !strings.Contains(deps, "udp/53 · 20 datagrams") || !strings.Contains(deps, "tcp/8080 · 60 connections") || strings.Contains(deps, "0 conns") {
		t.Errorf("nginx depends on %q, want udp/53 with its 20 datagrams and tcp/8080 with 60 connections", deps)
	}
}

// Agentless clients calling a load balancer and an agentless
// server a worker calls are two groups; collapsing every group draws no
// path from the worker to the load balancer, which the data does not have.
func TestPageExternalClientsApart(t *testing.T) {
	at := time.Now().Add(-5 * time.Minute)
	b := store.Batch{Hosts: []store.Host{
		{ID: "lb-1", Name: "lb-1", Addrs: []string{"198.51.100.20"}, LastSeen: at},
		{ID: "app-1", Name: "app-1", Addrs: []string{"198.51.100.21"}, LastSeen: at},
	}}
	o := func(host, dir, local, remote string, port uint16, comm string, c tracer.Counters) {
		b.Observations = append(b.Observations, store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: host, Direction: dir, Proto: "tcp",
			LocalAddr: local, RemoteAddr: remote, Port: port, Comm: comm, Counters: c, FirstSeen: at, LastSeen: at.Add(time.Second)})
	}
	for i := 1; i <= 3; i++ {
		o("lb-1", "inbound", "198.51.100.20", fmt.Sprintf("203.0.113.%d", i), 443, "haproxy", tracer.Counters{Connections: 10})
	}
	o("app-1", "outbound", "198.51.100.21", "203.0.113.9", 9000, "worker", tracer.Counters{FailedConnections: 5, FailedTimeout: 5})
	srv, _ := serve(t, writeSeed(t, "ext.db", b), Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	boxes := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#boxes .box')].map(b => b.dataset.group + ' ' + b.innerText)`)
	if strings.Join(boxes, ",") != "app-1 ▾ app-1 (1),external ▾ external (1),external clients ▾ external clients (3),lb-1 ▾ lb-1 (1)" {
		t.Errorf("boxes %q, want the three clients apart from the server", boxes)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#collapse-all"))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `window.deptrace.display.hasNode('group:app-1')`, `window.deptrace.display.nodes()`)
	reach := browsertest.JS[[]string](t, ctx, `(G => { const seen = new Set(['group:app-1']), todo = ['group:app-1'];
		while (todo.length) for (const m of G.outNeighbors(todo.pop())) if (!seen.has(m)) { seen.add(m); todo.push(m); }
		return [...seen]; })(window.deptrace.display)`)
	for _, n := range reach {
		if n == "group:lb-1" {
			t.Errorf("collapsed map draws a path from app-1 to lb-1 (reachable: %q); the data has none", reach)
		}
	}
}

// Back goes back to the previous focus and view, not out of the
// page; Esc clears the focus.
func TestPageBackRestoresFocus(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=all")
	browsertest.JS[bool](t, ctx, `window.deptrace.clickNode('`+idNginx+`'), true`)
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.focus === '`+idNginx+`'`, `document.querySelector('#map').dataset.focus`)
	// A click on redis in the focus panel moves the focus there.
	browsertest.JS[bool](t, ctx, `[...document.querySelectorAll('#deps button')].find(b => b.textContent.includes('redis-server')).click(), true`)
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.focus === '`+idRedis+`'`, `document.querySelector('#map').dataset.focus`)
	focusShown := `[location.href, (document.querySelector('#map') || {dataset: {}}).dataset.focus]`
	browsertest.JS[bool](t, ctx, `history.back(), true`)
	browsertest.Until(t, ctx, `document.querySelector('#map') && document.querySelector('#map').dataset.focus === '`+idNginx+`'`, focusShown)
	if n := text(t, ctx, "#focus-name"); n != "nginx on web-1 (198.51.100.1)" {
		t.Errorf("after Back the focus panel names %q, want nginx", n)
	}
	browsertest.JS[bool](t, ctx, `history.back(), true`)
	browsertest.Until(t, ctx, `document.querySelector('#map') && document.querySelector('#map').dataset.focus === '' && document.querySelector('#map').dataset.nodes === '5'`, focusShown)
	if hidden := browsertest.JS[bool](t, ctx, `document.querySelector('#focus-panel').hidden`); !hidden {
		t.Error("after Back to the whole map the focus panel is still shown")
	}
	// The view: Table, then Back is the map again.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#view-table"))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.body.dataset.view === 'table'`, `document.body.dataset.view`)
	browsertest.JS[bool](t, ctx, `history.back(), true`)
	browsertest.Until(t, ctx, `document.body && document.body.dataset.view === 'map' && !document.querySelector('#map-view').hidden`, `[location.href, document.body && document.body.dataset.view]`)
	// Esc clears a focus.
	browsertest.JS[bool](t, ctx, `window.deptrace.clickNode('`+idRedis+`'), true`)
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.focus === '`+idRedis+`'`, `document.querySelector('#map').dataset.focus`)
	if err := chromedp.Do(ctx, chromedp.KeyEvent(kb.Escape)); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.focus === '' && !location.search.includes('focus=')`, focusShown)
}

// In a focus view (no boxes), every node's label tells it apart:
// two webapps by their hosts, a port nobody answered by its port, an
// external server by its address and port.
func TestPageLabelsTellNodesApart(t *testing.T) {
	at := time.Now().Add(-5 * time.Minute)
	addr := map[string]string{"app-a": "198.51.100.31", "app-b": "198.51.100.32", "db-1": "198.51.100.33"}
	b := store.Batch{}
	for _, h := range []string{"app-a", "app-b", "db-1"} {
		b.Hosts = append(b.Hosts, store.Host{ID: h, Name: h, Addrs: []string{addr[h]}, LastSeen: at})
	}
	c := tracer.Counters{Connections: 10, BytesSent: 1000, BytesReceived: 9000}
	for _, h := range []string{"app-a", "app-b"} {
		b.Observations = append(b.Observations, callObservations(at, h, addr[h], "webapp", "db-1", addr["db-1"], "postgres", "tcp", 5432, c, c)...)
	}
	o := func(remote string, port uint16, c tracer.Counters) {
		b.Observations = append(b.Observations, store.Observation{Bucket: at.Truncate(store.DefaultBucket), HostID: "app-a", Direction: "outbound", Proto: "tcp",
			LocalAddr: addr["app-a"], RemoteAddr: remote, Port: port, Comm: "webapp", Counters: c, FirstSeen: at, LastSeen: at.Add(time.Second)})
	}
	o(addr["db-1"], 9001, tracer.Counters{FailedConnections: 4, FailedRefused: 4}) // nothing answers there
	o("203.0.113.7", 443, c)                                                       // no agent there
	srv, _ := serve(t, writeSeed(t, "labels.db", b), Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&depth=2&focus="+url.QueryEscape("workload:db-1/postgres"))
	browsertest.Until(t, ctx, `window.deptrace.labels().length === window.deptrace.display.order`, `[window.deptrace.display.nodes(), window.deptrace.labels().map(l => l.label)]`)
	labels := browsertest.JS[[]string](t, ctx, `window.deptrace.labels().map(l => l.label).sort()`)
	want := []string{"203.0.113.7:443", "? tcp/9001", "postgres", "webapp on app-a", "webapp on app-b"}
	if strings.Join(labels, "|") != strings.Join(want, "|") {
		t.Errorf("focus view labels %q, want %q", labels, want)
	}
}

// A link's values the page does not offer are said on the status
// line, with what is shown instead; so is a range narrower than the
// store's minutes.
func TestPageSaysWhatItCoerced(t *testing.T) {
	path, now := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=2h&depth=7&by=pod&focus="+url.QueryEscape(idNginx))
	st := text(t, ctx, "#status")
	for _, w := range []string{"range 2h is not offered: showing the last 1 h", "depth 7 is not offered: showing depth 1", "node (by) pod is not offered: showing workloads"} {
		if !strings.Contains(st, w) {
			t.Errorf("status %q lacks %q", st, w)
		}
	}
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=custom")
	if st := text(t, ctx, "#status"); !strings.Contains(st, "range custom needs since or until: showing the last 1 h") {
		t.Errorf("status %q: range=custom without times not said", st)
	}
	if r := browsertest.JS[string](t, ctx, `document.querySelector('#range').value`); r != "1h" {
		t.Errorf("range menu %q, want 1h (what is shown)", r)
	}
	// 20 seconds inside the minute of the recent traffic: the whole minute is shown.
	m := now.Add(-10 * time.Minute).UTC().Truncate(time.Minute)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&since="+m.Add(10*time.Second).Format(time.RFC3339)+"&until="+m.Add(30*time.Second).Format(time.RFC3339))
	if st := text(t, ctx, "#status"); !strings.Contains(st, "the store keeps counts per whole minute: showing ") {
		t.Errorf("status %q: a 20-second range does not say it shows the whole minute", st)
	}
}

// The empty store: the map says there is no data in the range
// and what to do, not only "0 nodes, 0 edges".
func TestPageEmptyStoreSaysSo(t *testing.T) {
	srv, _ := serve(t, writeSeed(t, "empty.db", store.Batch{}), Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/")
	if e := text(t, ctx, "#empty"); !strings.Contains(e, "No dependencies in this range") || !strings.Contains(e, "deptrace agent") {
		t.Errorf("empty map says %q", e)
	}
}
