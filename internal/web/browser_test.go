package web

// Browser tests: the real page in Debian's chromium-headless-shell, driven
// by chromedp, against a real server over a seeded SQLite store.

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deptrace/deptrace/internal/browsertest"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

func mapData(t *testing.T, ctx context.Context) map[string]string {
	return browsertest.JS[map[string]string](t, ctx, `Object.assign({}, document.querySelector('#map').dataset)`)
}

// docScreenshots are the screenshots docs/web.md shows: with
// DEPTRACE_UPDATE_SCREENSHOTS=1 the test writes them into docs/images/.
var docScreenshots = map[string]bool{"map": true, "edge-history": true, "node-history": true, "map-400": true, "map-namespaces": true, "map-fleet": true}

// screenshot saves the page (into $DEPTRACE_SCREENSHOTS when set, to look
// at; the documentation's into docs/images/ with
// DEPTRACE_UPDATE_SCREENSHOTS=1) and returns it decoded.
func screenshot(t *testing.T, ctx context.Context, name string) image.Image {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("DEPTRACE_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("DEPTRACE_UPDATE_SCREENSHOTS") == "1" && docScreenshots[name] {
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "images", name+".png"), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img, err := png.Decode(bytes.NewReader(buf))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// pixels counts the pixels of img close to colour c (0xRRGGBB).
func pixels(img image.Image, c uint32) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			d := func(a uint32, want uint32) int { return int(a>>8) - int(want) }
			dr, dg, db := d(r, c>>16&0xff), d(g, c>>8&0xff), d(bl, c&0xff)
			if dr*dr+dg*dg+db*db < 30*30 {
				n++
			}
		}
	}
	return n
}

func TestBrowserMapRendersNodesAndEdges(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	d := mapData(t, ctx)
	if d["nodes"] != "4" || d["edges"] != "3" || d["unhealthy"] != "1" {
		t.Errorf("map of the last hour: %v, want 4 nodes, 3 edges, 1 unhealthy (redis: failed connects)", d)
	}
	if n := browsertest.JS[int](t, ctx, `document.querySelectorAll('#map canvas').length`); n == 0 {
		t.Error("no canvas: sigma did not start")
	}
	// Layered left to right by the worker (the map is drawn at once with
	// the grouped layout, then moves): every client left of what it
	// depends on, every node labelled, each namespace a box.
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	browsertest.Until(t, ctx, `window.deptrace.labelled().length === window.deptrace.display.order`, `[window.deptrace.labelled(), window.deptrace.display.nodes()]`)
	if l := browsertest.JS[[]string](t, ctx, `window.deptrace.display.nodes().map(id => window.deptrace.display.getNodeAttribute(id, 'label')).sort()`); strings.Join(l, ",") != "192.0.2.53:53,nginx,postgres,redis-server" {
		t.Errorf("node labels %q", l)
	}
	if b := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#boxes .box')].map(b => b.dataset.group + ' ' + b.innerText)`); strings.Join(b, ",") != "cache-1 ▾ cache-1 (1),db-1 ▾ db-1 (1),external ▾ external (1),web-1 ▾ web-1 (1)" {
		t.Errorf("boxes %q", b)
	}
	if s := browsertest.JS[string](t, ctx, `document.querySelector('#status').textContent`); !strings.Contains(s, "4 nodes, 3 edges") {
		t.Errorf("status %q", s)
	}
	// WebGL really drew: the workload colour is on the screen, and the
	// red of the unhealthy edge.
	img := screenshot(t, ctx, "map-seeded")
	for name, c := range map[string]uint32{"workload node": 0x3366cc, "unhealthy edge": 0xe03131} {
		if n := pixels(img, c); n < 20 {
			t.Errorf("%s colour #%06x: %d pixels on the screenshot, want it drawn", name, c, n)
		}
	}

	x := func(id string) float64 {
		return browsertest.JS[float64](t, ctx, `window.deptrace.position('`+id+`').x`)
	}
	for _, to := range []string{idPostgres, idRedis, idDNS} {
		if x(idNginx) >= x(to) {
			t.Errorf("nginx (x=%g) is not left of %s (x=%g)", x(idNginx), to, x(to))
		}
	}

	// Clicking an edge shows its history: one bar series with a point per
	// step of the range (the last hour, 30 steps of 2 minutes, or 31 when
	// the range starts inside a minute), from /api/series.
	browsertest.JS[bool](t, ctx, `window.deptrace.clickEdge(window.deptrace.display.edge('`+idNginx+`', '`+idRedis+`')), true`)
	browsertest.Until(t, ctx, `!!document.querySelector('#details .history-chart canvas')`, `document.querySelector('#details').innerText`)
	// The number of points is uPlot's own: its x values, and every series'
	// values, one per step.
	if n := browsertest.JS[string](t, ctx, `(u => u.data.map(d => d.length).join(' ') + ' ' + u.series.length)(document.querySelector('#details .history-chart').uplot)`); n != "30 30 30 3" && n != "31 31 31 3" {
		t.Errorf("history of the last hour: uPlot data lengths and series %q, want 30 (2-minute steps) for x, connections and failed", n)
	}
	if l := browsertest.JS[string](t, ctx, `document.querySelector('#details .history-chart').getAttribute('aria-label')`); l != "connections per 2 min: 5 in all, 3 failed" {
		t.Errorf("history chart %q", l)
	}
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#details').innerText`); !strings.Contains(h, "unhealthy: 3 of 8 connection attempts failed") {
		t.Errorf("edge details lack the reason:\n%s", h)
	}
	// Its other charts: failures by cause (here no cause was reported:
	// "other"), connect latency, bytes; a point per step each.
	charts := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#details .history-chart')].map(s => s.dataset.chart + ' ' + s.uplot.data[0].length + ' ' + s.getAttribute('aria-label'))`)
	n := browsertest.JS[string](t, ctx, `String(document.querySelector('#details .history-chart').uplot.data[0].length)`)
	want := []string{
		"volume " + n + " connections per 2 min: 5 in all, 3 failed",
		"failures " + n + " Failed connections by cause: refused 0 in all, timed out 0 in all, reset 0 in all, unreachable 0 in all, other 3 in all",
		"latency " + n + " Connect latency: avg max 0 µs, max max 0 µs",
		"bytes " + n + " Bytes per 2 min: sent 500 B in all, received 4.9 KiB in all",
	}
	if strings.Join(charts, "|") != strings.Join(want, "|") {
		t.Errorf("edge history charts:\n%q\nwant\n%q", charts, want)
	}
	browsertest.JS[bool](t, ctx, `document.querySelector('#details .history').scrollIntoView(), true`)
	screenshot(t, ctx, "edge-history")

	// Clicking a node shows its history: connections/s in and out,
	// failures by cause, latency and bytes, a point per step each.
	browsertest.JS[bool](t, ctx, `window.deptrace.clickNode('`+idNginx+`'), true`)
	browsertest.Until(t, ctx, `!!document.querySelector('#details .history[data-node] .history-chart[data-chart="bytes"] canvas')`, `document.querySelector('#details').innerText`)
	nodeCharts := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#details .history[data-node] .history-chart')].map(s => s.dataset.chart + ' ' + s.uplot.data[0].length)`)
	if m := browsertest.JS[string](t, ctx, `String(document.querySelector('#details .history[data-node] .history-chart').uplot.data[0].length)`); (m != "30" && m != "31") ||
		strings.Join(nodeCharts, ",") != "connections "+m+",failures "+m+",latency "+m+",bytes "+m {
		t.Errorf("node history charts %q, want 4 of 30 (or 31) points", nodeCharts)
	}
	if l := browsertest.JS[string](t, ctx, `document.querySelector('#details .history-chart[data-chart="bytes"]').getAttribute('aria-label')`); l != "Bytes per 2 min: to it 14.6 KiB in all, from it 1.5 KiB in all" {
		// nginx, a client only: received 1,000 B per connection (15,000 B),
		// sent 100 B per connection (1,500 B).
		t.Errorf("node bytes chart %q", l)
	}
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#details').innerText`); !strings.Contains(h, "health\tok") && !strings.Contains(h, "health\nok") {
		t.Errorf("node details lack its health:\n%s", h)
	}
	browsertest.JS[bool](t, ctx, `document.querySelector('#details .history[data-node]').scrollIntoView(), true`)
	screenshot(t, ctx, "node-history")
	// A box collapses its group into one node.
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#boxes .box[data-group="db-1"] button`))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `window.deptrace.display.hasNode('group:db-1') && !window.deptrace.display.hasNode('`+idPostgres+`')`, `window.deptrace.display.nodes()`)
}

// The degraded state: python3's 2 resets in 3 connections are too few to
// be unhealthy, and amber with the reason on the map, in the details and
// in the table.
func TestBrowserDegradedEdge(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=all")
	if d := mapData(t, ctx); d["degraded"] != "1" || d["unhealthy"] != "1" {
		t.Errorf("map of all history: %v, want 1 degraded and 1 unhealthy edge", d)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	img := screenshot(t, ctx, "degraded")
	if n := pixels(img, 0xf59f00); n < 20 {
		t.Errorf("degraded colour drawn on %d pixels", n)
	}
	browsertest.JS[bool](t, ctx, `window.deptrace.clickEdge(window.deptrace.display.edge('`+idPython+`', '`+idPostgres+`')), true`)
	browsertest.Until(t, ctx, `!!document.querySelector('#details .history-chart canvas')`, `document.querySelector('#details').innerText`)
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#details').innerText`); !strings.Contains(h, "degraded: 2 resets in 3 connections (0 sent by the client, 2 received)") || !strings.Contains(h, "1 degraded") {
		t.Errorf("degraded edge details:\n%s", h)
	}
	browsertest.Open(t, ctx, srv.URL+"/?view=table&range=all")
	if r := browsertest.JS[string](t, ctx, `document.querySelector('#edges tbody tr.degraded').innerText.replace(/\s+/g, ' ')`); !strings.Contains(r, "python3 on worker-1") || !strings.Contains(r, "degraded: 2 resets in 3 connections (0 sent by the client, 2 received)") {
		t.Errorf("degraded row %q, want its reason", r)
	}
}

func TestBrowserSearchAndFocus(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=all")
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#search"), "redis-serv")); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.matches === '1'`, `document.querySelector('#map').dataset.matches`)
	if got := browsertest.JS[string](t, ctx, `document.querySelector('#matches').innerText`); !strings.Contains(got, "redis-server on cache-1 (198.51.100.3)") {
		t.Errorf("matches %q", got)
	}
	// Click the match: the map shows its neighbourhood, the panel its
	// dependents, and the URL the focus.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#matches button"))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.focus === '`+idRedis+`'`, `document.querySelector('#map').dataset.focus`)
	if d := mapData(t, ctx); d["nodes"] != "2" || d["edges"] != "1" {
		t.Errorf("focus on redis: %v, want redis and nginx", d)
	}
	if got := browsertest.JS[string](t, ctx, `document.querySelector('#dependents').innerText`); !strings.Contains(got, "nginx on web-1") {
		t.Errorf("dependents of redis: %q", got)
	}
	if u := browsertest.JS[string](t, ctx, `location.search`); !strings.Contains(u, "focus=workload%3Acache-1%2Fredis-server") || !strings.Contains(u, "q=redis-serv") {
		t.Errorf("URL %q lacks the focus and the search", u)
	}
	screenshot(t, ctx, "focus")

	// Depth: postgres at depth 1 is its two clients; at depth 2 also what
	// nginx uses. A link with the state opens the same view.
	browsertest.Open(t, ctx, srv.URL+"/?range=all&focus="+idPostgres+"&depth=1")
	if d := mapData(t, ctx); d["nodes"] != "3" || d["edges"] != "2" {
		t.Errorf("postgres depth 1: %v, want 3 nodes 2 edges", d)
	}
	deps := browsertest.JS[string](t, ctx, `document.querySelector('#dependents').innerText`)
	if !strings.Contains(deps, "nginx on web-1") || !strings.Contains(deps, "python3 on worker-1") {
		t.Errorf("dependents of postgres: %q", deps)
	}
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#depth"), "2")); err != nil {
		t.Fatal(err)
	}
	browsertest.JS[bool](t, ctx, `document.querySelector('#depth').dispatchEvent(new Event('change'))`)
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.nodes === '5'`, `document.querySelector('#map').dataset.nodes`)
	if u := browsertest.JS[string](t, ctx, `location.search`); !strings.Contains(u, "depth=2") {
		t.Errorf("URL %q lacks depth=2", u)
	}

	// Node: host makes one node per host; the URL keeps it.
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=all")
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#by"), "host")); err != nil {
		t.Fatal(err)
	}
	browsertest.JS[bool](t, ctx, `document.querySelector('#by').dispatchEvent(new Event('change'))`)
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.nodes === '5' && document.querySelector('#map').dataset.edges === '4' && location.search.includes('by=host')`,
		`[document.querySelector('#map').dataset.nodes, location.search]`)
	if got := browsertest.JS[string](t, ctx, `document.querySelector('#map').dataset.focus || ''`); got != "" {
		t.Errorf("focus kept across a change of Node: %q", got)
	}
}

func TestBrowserTableListsEveryEdge(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=table&range=all")
	rows := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#edges tbody tr')].map(r => r.innerText.replace(/\s+/g, ' '))`)
	want := []string{
		"nginx on web-1 (198.51.100.1) 198.51.100.2:5432 on db-1 nginx → postgres tcp 17",
		"nginx on web-1 (198.51.100.1) 198.51.100.3:6379 on cache-1 nginx → redis-server tcp 5 0 3", // connections, datagrams, failed
		"nginx on web-1 (198.51.100.1) 192.0.2.53:53 nginx → ? udp 0",
		"python3 on worker-1 (198.51.100.4) 198.51.100.2:5432 on db-1 python3 → postgres tcp 3",
	}
	if len(rows) != len(want) {
		t.Fatalf("table has %d rows, want %d: %q", len(rows), len(want), rows)
	}
	for _, w := range want {
		found := false
		for _, r := range rows {
			found = found || strings.Contains(r, w)
		}
		if !found {
			t.Errorf("no row contains %q in %q", w, rows)
		}
	}
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#edges tbody tr.unhealthy').innerText`); !strings.Contains(h, "6379") || !strings.Contains(h, "unhealthy") {
		t.Errorf("unhealthy row %q", h)
	}
	// The health column gives the reason, as the details do; sorted, the
	// worst comes first; the search finds a row by its reason.
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#edges tbody tr.unhealthy td.health').innerText`); h != "unhealthy: 3 of 8 connection attempts failed (37.5 %)" {
		t.Errorf("health of the unhealthy row %q, want the state with its reason", h)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`th button[data-sort="health"]`))); err != nil {
		t.Fatal(err)
	}
	if h := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#edges tbody td.health')].map(td => td.innerText)`); len(h) != 4 || !strings.HasPrefix(h[0], "unhealthy: ") || !strings.HasPrefix(h[1], "degraded: ") || h[2] != "ok" || h[3] != "ok" {
		t.Errorf("health sorted worst first: %q", h)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`th button[data-sort="health"]`))); err != nil {
		t.Fatal(err)
	}
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#edges tbody tr:last-child td.health').innerText`); !strings.HasPrefix(h, "unhealthy: ") {
		t.Errorf("health sorted the other way: last row %q", h)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#search"), "attempts failed")); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#edges').dataset.rows === '1'`, `document.querySelector('#edges').dataset.rows`)
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#edges tbody tr').innerText`); !strings.Contains(h, "6379") {
		t.Errorf("search by reason found %q", h)
	}
	browsertest.JS[bool](t, ctx, `(s => { s.value = ''; s.dispatchEvent(new Event('input')); return true; })(document.querySelector('#search'))`)
	browsertest.Until(t, ctx, `document.querySelector('#edges').dataset.rows === '4'`, `document.querySelector('#edges').dataset.rows`)
	// Sort by connections (descending first), then filter.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`th button[data-sort="connections"]`))); err != nil {
		t.Fatal(err)
	}
	first := browsertest.JS[string](t, ctx, `document.querySelector('#edges tbody tr td.connections').innerText`)
	if first != "17" {
		t.Errorf("first row by connections: %q, want 17", first)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#search"), "python")); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#edges').dataset.rows === '1'`, `document.querySelector('#edges').dataset.rows`)
	if u := browsertest.JS[string](t, ctx, `location.search`); !strings.Contains(u, "sort=connections") || !strings.Contains(u, "q=python") {
		t.Errorf("URL %q lacks sort and search", u)
	}
	screenshot(t, ctx, "table")
}

func TestBrowserDiffMarksNewEdges(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&range=1h&diff=1")
	if d := mapData(t, ctx); d["appeared"] != "2" || d["disappeared"] != "1" || d["edges"] != "4" {
		t.Errorf("diff map: %v, want 2 appeared, 1 disappeared of 4 edges", d)
	}
	img := screenshot(t, ctx, "diff")
	if n := pixels(img, 0x2b8a3e); n < 20 {
		t.Errorf("appeared-edge colour drawn on %d pixels", n)
	}
	browsertest.Open(t, ctx, srv.URL+"/?view=table&range=1h&diff=1")
	app := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#edges tbody tr.appeared')].map(r => r.innerText.replace(/\s+/g, ' '))`)
	gone := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#edges tbody tr.disappeared')].map(r => r.innerText.replace(/\s+/g, ' '))`)
	if len(app) != 2 || !strings.Contains(strings.Join(app, "|"), "198.51.100.3:6379 on cache-1") {
		t.Errorf("appeared rows %q", app)
	}
	if len(gone) != 1 || !strings.Contains(gone[0], "python3 on worker-1") {
		t.Errorf("disappeared rows %q", gone)
	}
}

func TestBrowserTokenCookie(t *testing.T) {
	const token = "browser-token-0123456789"
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{Token: token})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=table&range=all&token="+token)
	if u := browsertest.JS[string](t, ctx, `location.search`); strings.Contains(u, "token") {
		t.Errorf("token still in the URL: %q", u)
	}
	if n := browsertest.JS[string](t, ctx, `document.querySelector('#edges').dataset.rows`); n != "4" {
		t.Errorf("table rows with token cookie: %s", n)
	}
}

// A map beyond dagre's size (400 nodes, 300 edges) is layered by the
// worker's linear layout: every edge points left to right. It is opened
// with its groups expanded (groups=expanded): by itself it would open on
// its 100 groups (TestBrowserDenseMapOpensOnGroups).
func TestBrowserLinearLayeredLayout(t *testing.T) {
	path := t.TempDir() + "/mid.db"
	history(t, path, time.Now(), 100, 3, 1)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&groups=expanded")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	d := mapData(t, ctx)
	if d["nodes"] != "400" || d["edges"] != "300" || d["layoutEngine"] != "linear" || d["boxes"] != "100" {
		t.Errorf("map %v: want 400 nodes, 300 edges, 100 boxes, laid out by the linear layout", d)
	}
	backwards := browsertest.JS[[]string](t, ctx, `(() => { const G = window.deptrace.display; return G.edges().filter(e => { const [s, t] = G.extremities(e); return G.getNodeAttribute(s, 'x') >= G.getNodeAttribute(t, 'x'); }); })()`)
	if len(backwards) > 0 {
		t.Errorf("%d edges do not point left to right: %q", len(backwards), backwards[:min(5, len(backwards))])
	}
	screenshot(t, ctx, "map-400")
}

// seedFleet writes a fleet of 70 machines, each its own network namespace:
// 40 web machines (nginx -> php-fpm -> memcached on each, php-fpm calling
// one of the app machines), 20 app machines (gunicorn, calling one of the
// database machines) and 10 database machines (pgbouncer -> postgres):
// 160 workloads in 70 groups, two of the web-to-app edges failing.
func seedFleet(t testing.TB) string {
	t.Helper()
	now := time.Now()
	at := now.Add(-5 * time.Minute)
	type machine struct{ id, addr string }
	var web, app, db []machine
	b := store.Batch{}
	add := func(into *[]machine, prefix string, n int) {
		for i := 0; i < n; i++ {
			m := machine{fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("10.%d.%d.1", len(b.Hosts)/256, len(b.Hosts)%256)}
			*into = append(*into, m)
			b.Hosts = append(b.Hosts, store.Host{ID: m.id, Name: m.id, Addrs: []string{m.addr}, LastSeen: now})
		}
	}
	add(&web, "web", 40)
	add(&app, "app", 20)
	add(&db, "db", 10)
	call := func(c machine, ccomm string, srv machine, scomm string, port uint16, failed uint64) {
		b.Observations = append(b.Observations, callObservations(at, c.id, c.addr, ccomm, srv.id, srv.addr, scomm, "tcp", port,
			tracer.Counters{Connections: 20, FailedConnections: failed, BytesSent: 2000, BytesReceived: 20000},
			tracer.Counters{Connections: 20, BytesSent: 20000, BytesReceived: 2000})...)
	}
	for i, w := range web {
		call(w, "nginx", w, "php-fpm", 9000, 0)
		call(w, "php-fpm", w, "memcached", 11211, 0)
		failed := uint64(0)
		if i%20 == 7 {
			failed = 12 // two unhealthy web-to-app edges
		}
		call(w, "php-fpm", app[i%len(app)], "gunicorn", 8080, failed)
	}
	for i, a := range app {
		call(a, "gunicorn", db[i%len(db)], "pgbouncer", 6432, 0)
	}
	for _, d := range db {
		call(d, "pgbouncer", d, "postgres", 5432, 0)
	}
	return writeSeed(t, "fleet.db", b)
}

// callObservations are a call's two ends as agents store them: the
// client's outbound observation and the server's inbound one, at at.
func callObservations(at time.Time, client, clientAddr, ccomm, server, serverAddr, scomm, proto string, port uint16, cc, sc tracer.Counters) []store.Observation {
	bucket := at.Truncate(store.DefaultBucket)
	return []store.Observation{
		{Bucket: bucket, HostID: client, Direction: "outbound", Proto: proto, LocalAddr: clientAddr, RemoteAddr: serverAddr, Port: port,
			Comm: ccomm, Counters: cc, FirstSeen: at, LastSeen: at.Add(time.Second)},
		{Bucket: bucket, HostID: server, Direction: "inbound", Proto: proto, LocalAddr: serverAddr, RemoteAddr: clientAddr, Port: port,
			Comm: scomm, Counters: sc, FirstSeen: at, LastSeen: at.Add(time.Second)},
	}
}

// writeSeed writes b into a new SQLite store named name and returns its path.
func writeSeed(t testing.TB, name string, b store.Batch) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path
}

// A map of 160 workloads in 70 network namespaces (seedFleet) is too
// dense to read whole: it opens on its groups, one node per machine,
// every label at least 7 px tall (14 px Arial's ascenders are 10 px: the
// labels are drawn at 70 % of their size or more), the unhealthy edges
// still red, the status line saying so; a search lights up the groups
// holding a match. The choice is then the user's:
// Expand all gives the 160 workloads, groups=expanded in the URL keeps them expanded
// across a new time range and on a fresh page opened on the link.
func TestBrowserDenseMapOpensOnGroups(t *testing.T) {
	srv, _ := serve(t, seedFleet(t), Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	d := mapData(t, ctx)
	if d["nodes"] != "70" || d["boxes"] != "0" || d["unhealthy"] != "2" {
		t.Errorf("map %v: want its 70 groups collapsed, no boxes, the 2 unhealthy edges kept", d)
	}
	status := func() string { return browsertest.JS[string](t, ctx, `document.querySelector('#status').textContent`) }
	if s := status(); !strings.Contains(s, "160 nodes") || !strings.Contains(s, "its 70 groups collapsed") {
		t.Errorf("status %q: want the graph's size and the collapsed groups named", s)
	}
	browsertest.Until(t, ctx, `window.deptrace.labels().length === 70`, `window.deptrace.labels().length`)
	if small := browsertest.JS[[]string](t, ctx, `window.deptrace.labels().filter(r => r.bottom - r.top < 7).map(r => r.label + ' ' + (r.bottom - r.top).toFixed(1))`); len(small) > 0 {
		t.Errorf("%d group labels under 7 px tall: %q", len(small), small[:min(5, len(small))])
	}
	screenshot(t, ctx, "map-fleet")

	// A search lights up the groups that hold a match: gunicorn runs on
	// the 20 app machines.
	search := func(q string) {
		browsertest.JS[bool](t, ctx, `(s => { s.value = '`+q+`'; s.dispatchEvent(new Event('input')); return true; })(document.querySelector('#search'))`)
	}
	search("gunicorn")
	browsertest.Until(t, ctx, `window.deptrace.labels().length === 20 && window.deptrace.labels().every(r => r.label.startsWith('app-'))`, `window.deptrace.labels().map(r => r.label)`)
	search("")
	browsertest.Until(t, ctx, `window.deptrace.labels().length === 70`, `window.deptrace.labels().length`)

	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#expand-all"))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.nodes === '160' && document.querySelector('#map').dataset.layout === 'layered'`, `Object.assign({}, document.querySelector('#map').dataset)`)
	if d := mapData(t, ctx); d["boxes"] != "70" || d["unhealthy"] != "2" {
		t.Errorf("expanded map %v: want 70 boxes and the 2 unhealthy edges", d)
	}
	t.Logf("expanded: labels %s px tall", browsertest.JS[string](t, ctx, `(() => { const h = window.deptrace.labels().map(r => r.bottom - r.top); return h.length + ' drawn, ' + Math.min(...h).toFixed(1) + '-' + Math.max(...h).toFixed(1); })()`))
	if s := status(); strings.Contains(s, "collapsed") {
		t.Errorf("status %q after Expand all still says the groups are collapsed", s)
	}
	if u := browsertest.JS[string](t, ctx, `location.search`); !strings.Contains(u, "groups=expanded") {
		t.Errorf("URL %q after Expand all: want groups=expanded, so that a link shows the map expanded", u)
	}
	screenshot(t, ctx, "map-fleet-expanded")

	// Reloaded for another range, the map stays as the user left it, and
	// so does a fresh page opened on the link.
	browsertest.JS[bool](t, ctx, `(s => { s.value = '24h'; s.dispatchEvent(new Event('change')); return true; })(document.querySelector('#range'))`)
	browsertest.Until(t, ctx, `new URLSearchParams(location.search).get('range') === '24h' && document.body.dataset.state === 'ready'`, `location.search + ' ' + document.body.dataset.state`)
	if d := mapData(t, ctx); d["nodes"] != "160" {
		t.Errorf("after a new range the map has %s nodes, want the 160 the user expanded", d["nodes"])
	}
	link := browsertest.JS[string](t, ctx, `location.href`)
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	browsertest.Open(t, ctx, link)
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.nodes === '160'`, `document.querySelector('#map').dataset.nodes`)
}

// A graph beyond 2,000 nodes opens on the table; the map is one click
// away and opens on its groups (Expand all draws all of it).
func TestBrowserLargeGraphOpensOnTable(t *testing.T) {
	path := t.TempDir() + "/large.db"
	history(t, path, time.Now(), 550, 3, 1) // 2,200 nodes, 1,650 edges
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/")
	if v := browsertest.JS[string](t, ctx, `document.body.dataset.view`); v != "table" {
		t.Fatalf("large graph opened on %q, want the table", v)
	}
	if s := browsertest.JS[string](t, ctx, `document.querySelector('#status').textContent`); !strings.Contains(s, "2200 nodes, 1650 edges") || !strings.Contains(s, "large graph") {
		t.Errorf("status %q", s)
	}
	if d := browsertest.JS[map[string]string](t, ctx, `Object.assign({}, document.querySelector('#edges').dataset)`); d["rows"] != "1650" || d["shown"] != "500" {
		t.Errorf("table %v: want 1650 rows, first 500 shown", d)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#all-rows"))); err != nil {
		t.Fatal(err)
	}
	if n := browsertest.JS[int](t, ctx, `document.querySelectorAll('#edges tbody tr').length`); n != 1650 {
		t.Errorf("show all: %d rows", n)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#view-map"))); err != nil {
		t.Fatal(err)
	}
	// The map opens on its groups, one node per namespace (550 hosts),
	// edges between groups added up; Expand all draws all of it.
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.nodes === '550'`, `document.querySelector('#map').dataset.nodes`)
	if d := mapData(t, ctx); d["unhealthy"] == "0" {
		t.Errorf("collapsed large map %v: the unhealthy edges are gone", d)
	}
	screenshot(t, ctx, "large-collapsed")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#expand-all"))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.nodes === '2200'`, `document.querySelector('#map').dataset.nodes`)
	if d := mapData(t, ctx); d["edges"] != "1650" || d["unhealthy"] == "0" {
		t.Errorf("large map %v", d)
	}
	screenshot(t, ctx, "large-map")
}

// Grouped by Kubernetes namespace: the checkout pod's workload sits in
// the box of its namespace, nodes outside pods in none (the external DNS
// server in "external"); the box collapses the namespace into one node.
func TestBrowserKubernetesNamespaceBoxes(t *testing.T) {
	path, _ := seedNamed(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map&group=k8s")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	if b := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#boxes .box')].map(b => b.dataset.group + ' ' + b.innerText)`); strings.Join(b, ",") != "external ▾ external (1),k8s/shop ▾ k8s/shop (1)" {
		t.Errorf("boxes %q", b)
	}
	// Nodes in no box get room from the boxes too.
	browsertest.Until(t, ctx, `window.deptrace.labels().length === window.deptrace.display.order`, `window.deptrace.labels()`)
	if problems, _ := layoutProblems(t, ctx); len(problems) > 0 {
		t.Errorf("Kubernetes namespace boxes: %q", problems)
	}
	if g := browsertest.JS[string](t, ctx, `document.querySelector('#groups').innerText.replace(/\s+/g, ' ')`); !strings.Contains(g, "k8s/shop (1)") || strings.Contains(g, "db-1") {
		t.Errorf("groups panel %q", g)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#boxes .box[data-group="k8s/shop"] button`))); err != nil {
		t.Fatal(err)
	}
	browsertest.Until(t, ctx, `window.deptrace.display.hasNode('group:k8s/shop') && !window.deptrace.display.hasNode('`+idCheckout+`')`, `window.deptrace.display.nodes()`)
}

// A client whose lookups fail is drawn red like an unhealthy node, and
// its details list the lookups per resolver with the failures by rcode,
// timeouts, latency and the reasons.
func TestBrowserClientDNSFailures(t *testing.T) {
	path, now := seed(t)
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	at := now.Add(-10 * time.Minute)
	err = s.Write(context.Background(), store.Batch{DNS: []store.DNSObservation{{
		Bucket: at.Truncate(store.DefaultBucket), HostID: "web-1", Comm: "nginx", Proto: "udp", Resolver: "192.0.2.53:53",
		DNSCounters: tracer.DNSCounters{Queries: 10, Answers: 4, NoError: 4, NXDomain: 1, ServFail: 2, Timeouts: 3,
			LatencyCount: 7, LatencySumUs: 14000, LatencyMaxUs: 9000},
		FirstSeen: at, LastSeen: at.Add(time.Second)}}})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	if c := browsertest.JS[string](t, ctx, `window.deptrace.display.getNodeAttribute('`+idNginx+`', 'color') + ' ' + window.deptrace.display.getNodeAttribute('`+idNginx+`', 'health')`); c != "#e03131 unhealthy" {
		t.Errorf("nginx with failing lookups drawn %q, want #e03131 unhealthy", c)
	}
	browsertest.JS[bool](t, ctx, `window.deptrace.clickNode('`+idNginx+`'), true`)
	browsertest.Until(t, ctx, `!!document.querySelector('#details table.dns tr.unhealthy')`, `document.querySelector('#details').innerText`)
	row := browsertest.JS[string](t, ctx, `document.querySelector('#details table.dns tr.unhealthy').innerText.replace(/\s+/g, ' ')`)
	if want := "192.0.2.53:53/udp 10 1 2 0 3 2.0 ms / 9.0 ms unhealthy: 5 of 10 lookups failed (50.0 %): 2 SERVFAIL, 3 timed out"; strings.TrimSpace(row) != want {
		t.Errorf("DNS row %q, want %q", row, want)
	}
	if h := browsertest.JS[string](t, ctx, `document.querySelector('#details').innerText`); !strings.Contains(h, "unhealthy: DNS via 192.0.2.53:53/udp: 5 of 10 lookups failed") {
		t.Errorf("node health without the DNS reason:\n%s", h)
	}
	// Its history has its lookups per step from /api/series?node=:
	// answers by code and timeouts, stacked, and their latency, a point
	// per step like the other charts, the unhealthy step noted.
	browsertest.Until(t, ctx, `!!document.querySelector('#details .history[data-node] .history-chart[data-chart="dns-latency"] canvas')`, `document.querySelector('#details').innerText`)
	charts := browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#details .history[data-node] .history-chart')].map(s => s.dataset.chart + ' ' + s.uplot.data[0].length + ' ' + s.uplot.data.length)`)
	n := browsertest.JS[string](t, ctx, `String(document.querySelector('#details .history[data-node] .history-chart').uplot.data[0].length)`)
	if want := "connections " + n + " 3,failures " + n + " 6,latency " + n + " 4,bytes " + n + " 3,dns " + n + " 6,dns-latency " + n + " 3"; (n != "30" && n != "31") || strings.Join(charts, ",") != want {
		t.Errorf("node history charts %q, want %q (30 or 31 points)", charts, want)
	}
	for chart, want := range map[string]string{
		"dns":         "DNS lookups per 2 min: NOERROR 4 in all, NXDOMAIN 1 in all, SERVFAIL 2 in all, other 0 in all, timed out 3 in all",
		"dns-latency": "DNS answer latency: avg max 2.0 ms, max max 9.0 ms",
	} {
		if l := browsertest.JS[string](t, ctx, `document.querySelector('#details .history-chart[data-chart="`+chart+`"]').getAttribute('aria-label')`); l != want {
			t.Errorf("%s chart %q, want %q", chart, l, want)
		}
	}
	if p := browsertest.JS[string](t, ctx, `document.querySelector('#details .history[data-node] p.bad').innerText`); p != "DNS: 1 steps unhealthy" {
		t.Errorf("note under the DNS charts %q", p)
	}
	browsertest.JS[bool](t, ctx, `document.querySelector('#details .history-chart[data-chart="dns"]').scrollIntoView(), true`)
	screenshot(t, ctx, "node-dns-history")
}

// A real chain (seedChain: curl -> nginx -> gunicorn -> postgres and
// redis) is layered left to right in the order of its calls, with its
// degraded and unhealthy edges and the client whose lookups time out; it
// is the map docs/web.md shows.
func TestBrowserChainMap(t *testing.T) {
	path, _ := seedChain(t)
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	browsertest.Until(t, ctx, `window.deptrace.labelled().length === window.deptrace.display.order`, `[window.deptrace.labelled(), window.deptrace.display.nodes()]`)
	if d := mapData(t, ctx); d["nodes"] != "6" || d["edges"] != "6" || d["unhealthy"] != "1" || d["degraded"] != "1" {
		t.Errorf("chain map %v, want 6 nodes, 6 edges, 1 unhealthy (redis), 1 degraded (postgres)", d)
	}
	x := func(id string) float64 {
		return browsertest.JS[float64](t, ctx, `window.deptrace.display.getNodeAttribute('`+id+`', 'x')`)
	}
	chain := []string{"workload:client-1/curl", "workload:web-1/nginx", "workload:app-1/gunicorn", "workload:db-1/postgres"}
	for i := 1; i < len(chain); i++ {
		if x(chain[i-1]) >= x(chain[i]) {
			t.Errorf("%s (x=%g) is not left of %s (x=%g)", chain[i-1], x(chain[i-1]), chain[i], x(chain[i]))
		}
	}
	if problems, titles := layoutProblems(t, ctx); len(problems) > 0 || titles != 6 {
		t.Errorf("chain map: %d titles shown (want 6), %q", titles, problems)
	}
	if h := browsertest.JS[string](t, ctx, `window.deptrace.display.getNodeAttribute('workload:client-1/curl', 'health')`); h != "unhealthy" {
		t.Errorf("curl, whose lookups time out, is %q, want unhealthy", h)
	}
	img := screenshot(t, ctx, "map")
	for name, c := range map[string]uint32{"workload node": 0x3366cc, "unhealthy": 0xe03131, "degraded edge": 0xf59f00} {
		if n := pixels(img, c); n < 20 {
			t.Errorf("%s colour #%06x: %d pixels on the screenshot, want it drawn", name, c, n)
		}
	}
}

// seedNamespaces writes the shape of tests/servicemap: every program in a
// network namespace of its own (one node per box, ids as long as the
// agent's), curl -> nginx -> python3 -> redis-server, memcached, postgres
// and a UDP collector (four backends in one column), and an unrelated
// pair, dbench -> pgbouncer.
func seedNamespaces(t testing.TB) string {
	t.Helper()
	now := time.Now()
	at := now.Add(-5 * time.Minute)
	host := func(i int) string { return "servicemap/dt4242-1-h" + string(rune('0'+i)) }
	addr := func(i int) string { return "198.51.100." + string(rune('0'+i)) }
	b := store.Batch{}
	for i := 1; i <= 9; i++ {
		b.Hosts = append(b.Hosts, store.Host{ID: host(i), Name: host(i), Addrs: []string{addr(i)}, LastSeen: now})
	}
	call := func(client int, ccomm string, server int, scomm, proto string, port uint16) {
		c := tracer.Counters{Connections: 20, BytesSent: 2000, BytesReceived: 20000}
		if proto == "udp" {
			c = tracer.Counters{DatagramsSent: 40}
		}
		b.Observations = append(b.Observations, callObservations(at, host(client), addr(client), ccomm, host(server), addr(server), scomm, proto, port, c, c)...)
	}
	call(1, "curl", 2, "nginx", "tcp", 80)
	call(2, "nginx", 3, "python3", "tcp", 8080)
	call(3, "python3", 4, "redis-server", "tcp", 6379)
	call(3, "python3", 5, "memcached", "tcp", 11211)
	call(3, "python3", 6, "postgres", "tcp", 5432)
	call(3, "python3", 7, "collector", "udp", 8125)
	call(8, "dbench", 9, "pgbouncer", "tcp", 6432)
	return writeSeed(t, "namespaces.db", b)
}

// layoutProblems reads, from the page as drawn, the group boxes and their
// titles (the DOM) and the node labels sigma drew in the last frame (the
// rectangles measured on the canvas that drew them), and lists every box
// overlapping another, every title over a label, every label outside its
// node's box and every node without a drawn label.
func layoutProblems(t *testing.T, ctx context.Context) (problems []string, titles int) {
	t.Helper()
	r := browsertest.JS[struct {
		Problems []string
		Titles   int
	}](t, ctx, `(() => {
	const m = document.querySelector('#map').getBoundingClientRect();
	const rect = (e) => { const r = e.getBoundingClientRect(); return { l: r.left, r: r.right, t: r.top, b: r.bottom }; };
	const hit = (a, b) => a.l < b.r && b.l < a.r && a.t < b.b && b.t < a.b;
	const inside = (a, b) => a.l >= b.l && a.r <= b.r && a.t >= b.t && a.b <= b.b;
	const f = (x) => [x.l, x.t, x.r, x.b].map(Math.round).join(',');
	const G = window.deptrace.display, out = [];
	const boxes = [...document.querySelectorAll('#boxes .box')].map((b) => Object.assign(rect(b), { g: b.dataset.group }));
	const titles = [...document.querySelectorAll('#boxes .box button')].filter((b) => getComputedStyle(b).display !== 'none')
		.map((b) => Object.assign(rect(b), { g: b.closest('.box').dataset.group }));
	const labels = window.deptrace.labels().map((x) => ({ id: x.id, text: x.label, l: x.left + m.left, r: x.right + m.left, t: x.top + m.top, b: x.bottom + m.top }));
	for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++)
		if (hit(boxes[i], boxes[j])) out.push('box ' + boxes[i].g + ' [' + f(boxes[i]) + '] overlaps box ' + boxes[j].g + ' [' + f(boxes[j]) + ']');
	for (const ti of titles) for (const l of labels)
		if (hit(ti, l)) out.push('title of ' + ti.g + ' [' + f(ti) + '] covers label ' + l.text + ' [' + f(l) + ']');
	for (const l of labels) {
		const b = boxes.find((x) => x.g === G.getNodeAttribute(l.id, 'box'));
		if (b && !inside(l, b)) out.push('label ' + l.text + ' [' + f(l) + '] outside its box ' + b.g + ' [' + f(b) + ']');
	}
	const drawn = new Set(labels.map((l) => l.id));
	G.forEachNode((id, a) => { if (!drawn.has(id)) out.push('label of ' + id + ' (' + a.label + ') not drawn'); });
	return { Problems: out, Titles: titles.length };
})()`)
	return r.Problems, r.Titles
}

// Group boxes on the layered map: with one program per network namespace
// (one node per box) and four backends in one column, no box overlaps
// another, no title covers a node's label, every label is drawn inside its
// box; at the page's size and at a small one, where the map opens below
// zoom 1 and labels and titles shrink with it.
func TestBrowserBoxesDoNotCoverLabels(t *testing.T) {
	srv, _ := serve(t, seedNamespaces(t), Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	for _, size := range [][2]int64{{1400, 900}, {700, 420}} {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(size[0], size[1])); err != nil {
			t.Fatal(err)
		}
		browsertest.Open(t, ctx, srv.URL+"/?view=map")
		browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
		if d := mapData(t, ctx); d["nodes"] != "9" || d["edges"] != "7" || d["boxes"] != "9" {
			t.Fatalf("%dx%d: map %v, want 9 nodes, 7 edges, 9 boxes", size[0], size[1], d)
		}
		// A frame after the layout, labels drawn.
		browsertest.Until(t, ctx, `window.deptrace.labels().length > 0`, `window.deptrace.labels()`)
		problems, titles := layoutProblems(t, ctx)
		name := "map-namespaces"
		if size[0] != 1400 {
			name += "-small"
		}
		screenshot(t, ctx, name)
		for _, p := range problems {
			t.Errorf("%dx%d: %s", size[0], size[1], p)
		}
		if size[0] == 1400 && titles != 9 {
			t.Errorf("%dx%d: %d box titles shown, want all 9", size[0], size[1], titles)
		}
		// The chain still reads left to right.
		x := func(id string) float64 {
			return browsertest.JS[float64](t, ctx, `window.deptrace.position('`+id+`').x`)
		}
		chain := []string{"curl", "nginx", "python3", "postgres"}
		for i := 1; i < len(chain); i++ {
			a, b := "workload:servicemap/dt4242-1-h"+strconv.Itoa(i)+"/"+chain[i-1], "workload:servicemap/dt4242-1-h"+strconv.Itoa(i+1)+"/"+chain[i]
			if i == 3 {
				b = "workload:servicemap/dt4242-1-h6/postgres"
			}
			if x(a) >= x(b) {
				t.Errorf("%s is not left of %s", a, b)
			}
		}
	}
	// A collapsed box is a node like the others, laid out with room for
	// its label: memcached's namespace collapsed, the rest still boxes.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 900)); err != nil {
		t.Fatal(err)
	}
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#boxes .box[data-group="servicemap/dt4242-1-h5"] button`))); err != nil {
		t.Fatal(err)
	}
	const group = "group:servicemap/dt4242-1-h5"
	browsertest.Until(t, ctx, `window.deptrace.display.hasNode('`+group+`') && document.querySelector('#map').dataset.layout === 'layered' && window.deptrace.labels().length === 9`,
		`[document.querySelector('#map').dataset.layout, window.deptrace.labels().map(l => l.label)]`)
	if a := browsertest.JS[string](t, ctx, `(a => [a.x, a.y, a.size].map(v => Number.isFinite(v) && v !== 0 ? 'ok' : String(v)).join(' '))(window.deptrace.display.getNodeAttributes('`+group+`'))`); a != "ok ok ok" {
		t.Errorf("collapsed group node x, y, size: %s", a)
	}
	problems, titles := layoutProblems(t, ctx)
	for _, p := range problems {
		t.Errorf("collapsed: %s", p)
	}
	if titles != 8 {
		t.Errorf("collapsed: %d box titles shown, want 8", titles)
	}
}

// A port nginx asked for and nothing answered (every connect refused, no
// listener seen) is no listening service: the node behind it is drawn
// unhealthy, and its details say nothing answers there, with the reason,
// never that it listens or drops.
func TestBrowserUnansweredPort(t *testing.T) {
	path, now := seed(t)
	s, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	at := now.Add(-10 * time.Minute)
	err = s.Write(context.Background(), store.Batch{Observations: []store.Observation{{
		Bucket: at.Truncate(store.DefaultBucket), HostID: "web-1", Direction: "outbound", Proto: "tcp",
		LocalAddr: "198.51.100.1", RemoteAddr: "198.51.100.2", Port: 7002, Comm: "nginx",
		Counters: tracer.Counters{FailedConnections: 3, FailedRefused: 3}, FirstSeen: at, LastSeen: at.Add(time.Second)}}})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	const asked = "workload:db-1/?tcp/198.51.100.2/7002"
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=map")
	browsertest.Until(t, ctx, `document.querySelector('#map').dataset.layout === 'layered'`, `document.querySelector('#map').dataset.layout`)
	if h := browsertest.JS[string](t, ctx, `window.deptrace.display.getNodeAttribute('`+asked+`', 'health')`); h != "unhealthy" {
		t.Errorf("the unanswered port's node drawn %q, want unhealthy", h)
	}
	browsertest.JS[bool](t, ctx, `window.deptrace.clickNode('`+asked+`'), true`)
	browsertest.Until(t, ctx, `document.querySelector('#details').innerText.includes('tcp/7002')`, `document.querySelector('#details').innerText`)
	d := browsertest.JS[string](t, ctx, `document.querySelector('#details').innerText`)
	if !strings.Contains(d, "tcp/7002 nothing answers") || !strings.Contains(d, "nothing answered: 3 connection attempts, none worked") || strings.Contains(d, "DROPPING") {
		t.Errorf("details of the unanswered port:\n%s", d)
	}
}

// A unix edge between two workloads names every socket it merges, and a
// datagram socket's traffic shows in the Datagrams column, not as zero
// connections.
func TestBrowserTableNamesUnixSockets(t *testing.T) {
	u := func(dir, local, remote, comm, peer string, c tracer.Counters) store.Observation {
		return store.Observation{Direction: dir, Proto: "unix", LocalAddr: local, RemoteAddr: remote, Comm: comm, PeerComm: peer, Counters: c}
	}
	rows := tableRows(t, seedVM(t,
		u("outbound", "", "/run/a.sock", "client", "server", tracer.Counters{Connections: 2, BytesSent: 20, BytesReceived: 30}),
		u("outbound", "", "@logd", "client", "server", tracer.Counters{DatagramsSent: 7, BytesSent: 70}),
		u("inbound", "@logd", "", "server", "", tracer.Counters{DatagramsReceived: 7, BytesReceived: 70}),
	))
	want := "client on vm (198.51.100.9) unix /run/a.sock, @logd on vm client → server unix 2 7 0 90 B 30 B"
	if len(rows) != 1 || !strings.Contains(rows[0], want) {
		t.Errorf("table rows %q; want one with %q", rows, want)
	}
}

// A process's folds to _other (--max-edges-per-node) are one server node
// per protocol, and the page names each by its protocol, as look does:
// two nodes labelled "_other (external)" could not be told apart.
func TestBrowserNamesFoldsByProtocol(t *testing.T) {
	fold := func(proto string, c tracer.Counters) store.Observation {
		return store.Observation{Direction: "outbound", Proto: proto, LocalAddr: "198.51.100.9", RemoteAddr: "_other", Comm: "scanner", Counters: c}
	}
	rows := tableRows(t, seedVM(t,
		fold("tcp", tracer.Counters{FailedConnections: 9, FailedRefused: 9}),
		fold("udp", tracer.Counters{DatagramsSent: 4, BytesSent: 40}),
	))
	var tcp, udp bool
	for _, r := range rows {
		tcp = tcp || strings.Contains(r, "tcp _other (external)")
		udp = udp || strings.Contains(r, "udp _other (external)")
	}
	if len(rows) != 2 || !tcp || !udp {
		t.Errorf("table rows %q; want two, naming tcp _other and udp _other", rows)
	}
}

// seedVM writes obs as one machine's agent saw them 5 minutes ago (host
// vm, 198.51.100.9; each observation's bucket, host and times set here)
// into a new store and returns its path.
func seedVM(t *testing.T, obs ...store.Observation) string {
	t.Helper()
	at := time.Now().Add(-5 * time.Minute)
	for i := range obs {
		obs[i].Bucket, obs[i].HostID, obs[i].FirstSeen, obs[i].LastSeen = at.Truncate(store.DefaultBucket), "vm", at, at.Add(time.Second)
	}
	return writeSeed(t, "deptrace.db", store.Batch{Hosts: []store.Host{{ID: "vm", Name: "vm", Addrs: []string{"198.51.100.9"}, LastSeen: at}}, Observations: obs})
}

// tableRows opens the page's table of all history over the store at path
// in Chromium and gives its rows' text, white space folded.
func tableRows(t *testing.T, path string) []string {
	t.Helper()
	srv, _ := serve(t, path, Options{})
	ctx := browsertest.Browser(t, 90*time.Second)
	browsertest.Open(t, ctx, srv.URL+"/?view=table&range=all")
	return browsertest.JS[[]string](t, ctx, `[...document.querySelectorAll('#edges tbody tr')].map(r => r.innerText.replace(/\s+/g, ' '))`)
}
