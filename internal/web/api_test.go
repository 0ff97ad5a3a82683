package web

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
)

func get(t *testing.T, srv string, path string, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body, resp.Header
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func getGraph(t *testing.T, srv, path string) graph.Graph {
	t.Helper()
	code, body, _ := get(t, srv, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	var g graph.Graph
	if err := json.Unmarshal(body, &g); err != nil {
		t.Fatalf("GET %s: %v\n%s", path, err, body)
	}
	return g
}

func nodeIDs(g graph.Graph) []string {
	var ids []string
	for _, n := range g.Nodes {
		ids = append(ids, n.ID)
	}
	return ids
}

func edgeKeys(g graph.Graph) []string {
	var ks []string
	for _, e := range g.Edges {
		ks = append(ks, e.From+" -> "+e.To)
	}
	return ks
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// /api/graph answers what `deptrace graph --format json` prints for the
// same range, byte for byte once the CLI's indentation is removed.
func TestGraphIsTheCLIJSON(t *testing.T) {
	path, now := seed(t)
	srv, _ := serve(t, path, Options{})
	g := getGraph(t, srv.URL, "/api/graph?since=1h")
	equal(t, "nodes", nodeIDs(g), []string{idNginx, idPostgres, idRedis, idDNS})
	equal(t, "edges", edgeKeys(g), []string{idNginx + " -> " + idPostgres, idNginx + " -> " + idRedis, idNginx + " -> " + idDNS})
	for _, e := range g.Edges {
		switch e.To {
		case idPostgres:
			if e.Connections != 10 || e.BytesSent != 1000 || e.BytesReceived != 10000 || e.Retransmits != 1 || e.Unhealthy {
				t.Errorf("postgres edge counters %+v: want the last hour only (10 conns), healthy with its one retransmit", e)
			}
		case idRedis:
			if e.Connections != 5 || e.FailedConnections != 3 || !e.Unhealthy {
				t.Errorf("redis edge %+v: want 5 conns, 3 failed, unhealthy", e)
			}
		}
	}

	// The CLI's path: Observations, Hosts, Listeners, Build, Write, on a
	// store opened the way the CLI opens it (no cache).
	st, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := store.Range{Since: now.Add(-3 * time.Hour)}
	obs, err := st.Observations(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	hosts, _ := st.Hosts(context.Background())
	listeners, _ := st.Listeners(context.Background(), r)
	// format 2 (the default, grouped by workload, process or host) and
	// format 1 (json-v1).
	for _, c := range []struct{ query, format, by string }{
		{"", "json", graph.ByWorkload}, {"&group_by=process", "json", graph.ByProcess}, {"&group_by=host", "json", graph.ByHost},
		{"&format=1", "json-v1", ""}, {"&format=2&group_by=workload", "json", graph.ByWorkload},
	} {
		g := graph.Build(obs, hosts, listeners)
		if c.by != "" {
			g = graph.Group(g, c.by)
		}
		g.Judge(graph.DefaultHealth) // as the CLI's look, graph and diff judge it
		g.JudgeDNS(graph.DefaultDNSHealth)
		var want bytes.Buffer
		if err := graph.Write(&want, g, c.format); err != nil {
			t.Fatal(err)
		}
		_, body, hdr := get(t, srv.URL, "/api/graph?since=3h"+c.query)
		var compact bytes.Buffer
		if err := json.Compact(&compact, want.Bytes()); err != nil {
			t.Fatal(err)
		}
		compact.WriteByte('\n')
		if !bytes.Equal(body, compact.Bytes()) {
			t.Errorf("/api/graph?%s differs from graph --format %s:\n%s\nwant\n%s", c.query, c.format, body, want.Bytes())
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
	}
	all := getGraph(t, srv.URL, "/api/graph")
	if len(all.Nodes) != 5 || len(all.Edges) != 4 {
		t.Errorf("all history: %d nodes %d edges, want 5 and 4", len(all.Nodes), len(all.Edges))
	}
	// until excludes the recent buckets: only the old window.
	old := getGraph(t, srv.URL, "/api/graph?until=30m")
	equal(t, "edges until 30m ago", edgeKeys(old), []string{idNginx + " -> " + idPostgres, idPython + " -> " + idPostgres})
}

// gzip is transparent to a client that asks for it.
func TestGraphGzip(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	_, plain, _ := get(t, srv.URL, "/api/graph")
	resp, err := http.Get(srv.URL + "/api/graph") // the transport asks for gzip and inflates
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !resp.Uncompressed || !bytes.Equal(body, plain) {
		t.Errorf("gzip answer: uncompressed=%v equal=%v", resp.Uncompressed, bytes.Equal(body, plain))
	}
}

func TestGraphFilters(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	cases := []struct {
		query string
		nodes []string
		edges []string
	}{
		{"proto=udp", []string{idNginx, idDNS}, []string{idNginx + " -> " + idDNS}},
		{"proto=TCP&port=6379", []string{idNginx, idRedis}, []string{idNginx + " -> " + idRedis}},
		{"port=5432", []string{idNginx, idPython, idPostgres}, []string{idNginx + " -> " + idPostgres, idPython + " -> " + idPostgres}},
		{"target=python3", []string{idPython, idPostgres}, []string{idPython + " -> " + idPostgres}},
		// Everything around postgres: its clients, and what they use.
		{"target=postgres&depth=1", []string{idNginx, idPython, idPostgres}, []string{idNginx + " -> " + idPostgres, idPython + " -> " + idPostgres}},
		{"target=198.51.100.2:5432&reverse=true", []string{idNginx, idPython, idPostgres}, []string{idNginx + " -> " + idPostgres, idPython + " -> " + idPostgres}},
		{"target=nginx&reverse=1", []string{}, []string{}},
		{"target=nginx&depth=1&since=1h", []string{idNginx, idPostgres, idRedis, idDNS}, []string{idNginx + " -> " + idPostgres, idNginx + " -> " + idRedis, idNginx + " -> " + idDNS}},
	}
	for _, c := range cases {
		g := getGraph(t, srv.URL, "/api/graph?"+c.query)
		equal(t, c.query+" nodes", nodeIDs(g), c.nodes)
		equal(t, c.query+" edges", edgeKeys(g), c.edges)
	}
}

func TestLook(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	var ans lookAnswer
	code, body, _ := get(t, srv.URL, "/api/look?target=nginx&since=1h")
	if code != 200 || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("look: %d %s", code, body)
	}
	if len(ans.Trees) != 1 || ans.Trees[0].Root.ID != idNginx {
		t.Fatalf("look nginx: trees %s", body)
	}
	var peers []string
	for _, b := range ans.Trees[0].Outbound {
		peers = append(peers, b.Peer.ID)
	}
	equal(t, "nginx depends on", peers, []string{idPostgres, idRedis, idDNS})
	if len(ans.Trees[0].Inbound) != 0 {
		t.Errorf("nothing depends on nginx, got %s", body)
	}

	// reverse: only what depends on postgres, no outbound list.
	ans = lookAnswer{}
	code, body, _ = get(t, srv.URL, "/api/look?target=postgres&reverse")
	if code != 200 || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("look reverse: %d %s", code, body)
	}
	if len(ans.Trees) != 1 || ans.Trees[0].Outbound != nil || !ans.Reverse || ans.Depth != 0 {
		t.Fatalf("look reverse: %s", body)
	}
	peers = nil
	for _, b := range ans.Trees[0].Inbound {
		peers = append(peers, b.Peer.ID)
	}
	equal(t, "depends on postgres", peers, []string{idNginx, idPython})
}

func TestDiff(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	var ans diffAnswer
	code, body, _ := get(t, srv.URL, "/api/diff?since=1h")
	if code != 200 || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("diff: %d %s", code, body)
	}
	keys := func(es []graph.Edge) []string { return edgeKeys(graph.Graph{Edges: es}) }
	equal(t, "appeared", keys(ans.Appeared), []string{idNginx + " -> " + idRedis, idNginx + " -> " + idDNS})
	equal(t, "disappeared", keys(ans.Disappeared), []string{idPython + " -> " + idPostgres})
	equal(t, "nodes", nodeIDs(graph.Graph{Nodes: ans.Nodes}), []string{idNginx, idRedis, idDNS, idPython, idPostgres})
	if d := ans.Until.Sub(ans.Since); d != time.Hour || ans.BeforeUntil != ans.Since || ans.BeforeSince != ans.Since.Add(-time.Hour) {
		t.Errorf("windows: %s", body)
	}

	// Explicit windows and a filter: only udp, against an empty window.
	ans = diffAnswer{}
	code, body, _ = get(t, srv.URL, "/api/diff?since=30m&until=now&before_since=3h&before_until=2h&proto=udp")
	if code != 200 || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("diff: %d %s", code, body)
	}
	equal(t, "udp appeared", keys(ans.Appeared), []string{idNginx + " -> " + idDNS})
	if len(ans.Disappeared) != 0 {
		t.Errorf("udp disappeared: %s", body)
	}
}

// Every bad parameter is a 400 (or 404 for a target that matches nothing)
// whose one-line JSON error names the parameter and what is allowed.
func TestBadParameters(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	cases := []struct {
		path string
		code int
		want string
	}{
		{"/api/graph?since=yesterday", 400, `invalid since "yesterday": allowed RFC 3339`},
		{"/api/graph?until=13:99", 400, `invalid until "13:99"`},
		{"/api/graph?since=1h&until=2h", 400, "invalid range: since"},
		{"/api/graph?depth=-1", 400, `invalid depth "-1": allowed 0 (unlimited) to 1000`},
		{"/api/graph?depth=two", 400, `invalid depth "two"`},
		{"/api/graph?proto=sctp", 400, `invalid proto "sctp": allowed tcp, udp, unix`},
		{"/api/graph?port=70000", 400, `invalid port "70000": allowed 0 to 65535`},
		{"/api/graph?port=http", 400, `invalid port "http"`},
		{"/api/graph?reverse=maybe", 400, `invalid reverse "maybe": allowed true or false`},
		{"/api/graph?format=dot", 400, `invalid format "dot": allowed 2 (the default) or 1 (deprecated: process and service nodes)`},
		{"/api/look?target=nginx&format=1", 400, `unknown parameter "format": allowed since, until, target, depth, reverse, proto, port, group_by`},
		{"/api/graph?group_by=pod", 400, `invalid group_by "pod": allowed workload, process, host`},
		{"/api/graph?format=1&group_by=host", 400, `invalid group_by "host" with format 1: format 1 is the process and service graph, never grouped; allowed group_by with format 2`},
		{"/api/diff?since=1h&group_by=", 200, ``},
		{"/api/graph?port=1&port=2", 400, "parameter port given 2 times"},
		{"/api/graph?target=nosuchthing", 404, `no host, address, service or process matches "nosuchthing"`},
		{"/api/look", 400, "missing target: allowed a host"},
		{"/api/look?target=nginx&depth=1001", 400, "invalid depth"},
		{"/api/look?target=ghost", 404, `matches "ghost"`},
		{"/api/diff", 400, "missing since"},
		{"/api/diff?since=1h&before_since=junk", 400, `invalid before_since "junk"`},
		{"/api/diff?since=1h&before_since=1h&before_until=2h", 400, "invalid range: before_since"},
		{"/api/diff?since=1h&until=nope", 400, `invalid until "nope"`},
		{"/api/nothing", 404, "no endpoint GET /api/nothing: allowed GET /api/graph, /api/look, /api/diff, /api/series, /api/dns"},
		{"/api/dns?limit=0", 400, `invalid limit "0": allowed 1 to 10000`},
		{"/api/dns?limit=many", 400, `invalid limit "many": allowed 1 to 10000`},
		{"/api/dns?limit=10001", 400, `invalid limit "10001"`},
		{"/api/dns?resolver=dns.example", 400, `invalid resolver "dns.example": allowed ADDRESS:PORT`},
		{"/api/dns?failing=perhaps", 400, `invalid failing "perhaps": allowed true or false`},
		{"/api/dns?since=1h&until=2h", 400, "invalid range: since"},
		{"/api/dns?target=nginx", 400, `unknown parameter "target": allowed since, until, host, process, resolver, failing, limit`},
	}
	for _, c := range cases {
		code, body, hdr := get(t, srv.URL, c.path)
		var e struct{ Error string }
		if err := json.Unmarshal(body, &e); err != nil || code != c.code || !strings.Contains(e.Error, c.want) || strings.Contains(e.Error, "\n") {
			t.Errorf("GET %s: %d %q, want %d with %q", c.path, code, body, c.code, c.want)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("GET %s: Content-Type %q", c.path, ct)
		}
	}
}

// Garbage in every parameter of every endpoint: always a JSON answer,
// never a 5xx, and the server still answers afterwards.
func TestGarbageNeverCrashes(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	garbage := []string{"", " ", "\x00", "%", "-", "--1", "1e999", "9999999999999999999999", "-9223372036854775808",
		"99999999999h", "2562048h", "100001d", "0.5d", "NaN", "Infinity", "😀", "' OR 1=1 --", "<script>", strings.Repeat("a", 10000),
		"::", "[::1]:99999", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "now", "15:04", "1", "0", "true"}
	for _, ep := range []string{"graph", "look", "diff"} {
		for _, p := range append(filterParams, "before_since", "before_until", "bogus") {
			for _, v := range garbage {
				q := url.Values{p: {v}}
				if ep != "look" || p != "target" {
					q.Set("target", "nginx")
				}
				if ep == "diff" && p != "since" {
					q.Set("since", "1h")
				}
				code, body, _ := get(t, srv.URL, "/api/"+ep+"?"+q.Encode())
				if code >= 500 || !json.Valid(body) {
					t.Errorf("/api/%s %s=%.40q: %d %.200s", ep, p, v, code, body)
				}
			}
		}
	}
	if code, _, _ := get(t, srv.URL, "/api/graph"); code != 200 {
		t.Errorf("server no longer answers: %d", code)
	}
}

func TestPageAndAssets(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	code, body, hdr := get(t, srv.URL, "/")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") || !bytes.Contains(body, []byte("/static/vendor/sigma-3.0.3.min.js")) {
		t.Fatalf("GET /: %d %s %.200s", code, hdr.Get("Content-Type"), body)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	for _, p := range []string{"/static/app.js", "/static/app.css", "/static/vendor/sigma-3.0.3.min.js", "/static/vendor/graphology-0.26.0.umd.min.js",
		"/static/vendor/sigma-LICENSE.txt", "/static/vendor/graphology-LICENSE.txt",
		"/static/layout-worker.js", "/static/vendor/dagre-3.1.3.min.js", "/static/vendor/dagre-LICENSE.txt",
		"/static/vendor/uplot-1.6.32.iife.min.js", "/static/vendor/uplot-1.6.32.min.css", "/static/vendor/uplot-LICENSE.txt"} {
		if code, body, _ := get(t, srv.URL, p); code != 200 || len(body) < 100 {
			t.Errorf("GET %s: %d, %d bytes", p, code, len(body))
		}
	}
	if code, _, _ := get(t, srv.URL, "/static/nope.js"); code != 404 {
		t.Errorf("missing asset: %d", code)
	}
	// The page's own file leads to the page (keeping the query), not to
	// /static/, which is no page.
	if code, _, hdr := get(t, srv.URL, "/static/index.html?since=1h"); code != http.StatusMovedPermanently || hdr.Get("Location") != "/?since=1h" {
		t.Errorf("GET /static/index.html: %d to %q, want 301 to /?since=1h", code, hdr.Get("Location"))
	}
	resp, err := http.Get(srv.URL + "/static/index.html")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte("/static/app.js")) {
		t.Errorf("GET /static/index.html, redirects followed: %d %.200s", resp.StatusCode, body)
	}
	if code, _, _ := get(t, srv.URL, "/other"); code != 404 {
		t.Errorf("GET /other: %d", code)
	}
}

// Without a token the server answers only loopback Host names, so a page
// elsewhere cannot reach it through DNS rebinding.
func TestForeignHostRefusedWithoutToken(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/graph", nil)
	req.Host = "attacker.example:7777"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("foreign Host: %d, want 403", resp.StatusCode)
	}
	for _, h := range []string{"localhost:7777", "127.0.0.1", "[::1]:7777", "127.1.2.3:80"} {
		if !loopbackHost(h) {
			t.Errorf("loopbackHost(%q) = false", h)
		}
	}
}

func TestTokenChecked(t *testing.T) {
	const token = "s3cret-token-0123456789"
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{Token: token})
	for _, p := range []string{"/", "/api/graph", "/api/look?target=nginx", "/api/diff?since=1h", "/static/app.js"} {
		for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "Bearer " + token + "x"}, {"Authorization", token}, {"Cookie", tokenCookie + "=nope"}} {
			code, body, h := get(t, srv.URL, p, hdr...)
			if code != http.StatusUnauthorized || !strings.Contains(string(body), "missing or wrong token") || h.Get("WWW-Authenticate") == "" {
				t.Errorf("GET %s with %q: %d %s, want 401", p, hdr, code, body)
			}
		}
		if code, body, _ := get(t, srv.URL, p, "Authorization", "Bearer "+token); code != 200 {
			t.Errorf("GET %s with the token: %d %s", p, code, body)
		}
	}
	// A token in the API's query string is not accepted (it would end up
	// in logs); the page takes it once and turns it into a cookie.
	if code, _, _ := get(t, srv.URL, "/api/graph?token="+token); code != http.StatusUnauthorized {
		t.Errorf("token as API query parameter: %d, want 401", code)
	}
	code, _, hdr := get(t, srv.URL, "/?view=table&token="+token)
	if code != http.StatusSeeOther || hdr.Get("Location") != "/?view=table" {
		t.Fatalf("page with ?token: %d Location %q", code, hdr.Get("Location"))
	}
	cookie := hdr.Get("Set-Cookie")
	if !strings.Contains(cookie, tokenCookie+"="+token) || !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "SameSite=Strict") {
		t.Fatalf("cookie %q", cookie)
	}
	if code, _, _ := get(t, srv.URL, "/api/graph", "Cookie", tokenCookie+"="+token); code != 200 {
		t.Errorf("with the cookie: %d", code)
	}
	// With a token, the Host check gives way: the server is meant to be
	// reached by name from elsewhere.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/graph", nil)
	req.Host = "deptrace.example:7777"
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("named host with token: %d", resp.StatusCode)
	}
}

func TestCheckListen(t *testing.T) {
	for _, c := range []struct {
		listen string
		token  bool
		want   string
	}{
		{"127.0.0.1:7777", false, ""},
		{"[::1]:7777", false, ""},
		{"localhost:0", false, ""},
		{"0.0.0.0:7777", false, "--listen 0.0.0.0:7777 is beyond loopback: --token-file is required"},
		{":7777", false, "--token-file is required"},
		{"[::]:7777", false, "--token-file is required"},
		{"192.0.2.1:7777", false, "--token-file is required"},
		{"0.0.0.0:7777", true, ""},
		{"7777", false, `invalid --listen "7777": allowed HOST:PORT`},
		{"127.0.0.1:http2x", false, `port "http2x" is not a port number`},
		{"127.0.0.1:99999", false, `port "99999" is not a port number`},
	} {
		err := CheckListen(c.listen, c.token)
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckListen(%q, %v) = %v, want %q", c.listen, c.token, err, c.want)
		}
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := ReadToken(write("ok", "  abcdefghijklmnopqrstuvwxyz\n")); err != nil || tok != "abcdefghijklmnopqrstuvwxyz" {
		t.Errorf("ReadToken: %q %v", tok, err)
	}
	for _, bad := range []string{"", "short", "two words and then some more"} {
		if _, err := ReadToken(write("bad", bad)); err == nil || !strings.Contains(err.Error(), "invalid --token-file") {
			t.Errorf("ReadToken(%q) = %v", bad, err)
		}
	}
	if _, err := ReadToken(dir + "/missing"); err == nil || !strings.Contains(err.Error(), "read --token-file") {
		t.Errorf("missing file: %v", err)
	}
}

// serve's --health-* thresholds reach the API: strict ones make the one
// retransmit of the postgres edge red, with the reason.
func TestHealthThresholdsOption(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{Health: graph.Health{MinEvents: 1, FailedRatio: 0.01, ResetRatio: 0.01, RetransmitsPerConn: 0}})
	g := getGraph(t, srv.URL, "/api/graph?since=1h")
	for _, e := range g.Edges {
		if e.To == idPostgres && (!e.Unhealthy || len(e.Reasons) != 1 || e.Reasons[0] != "1 retransmitted segments in 10 connections (0.10 per connection)") {
			t.Errorf("postgres edge under strict thresholds: %+v", e)
		}
	}
}

// /api/series: an edge's counters per step over the range, in as many
// points as the range has steps, summing to the edge's totals.
func TestSeries(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	q := "/api/series?since=1h&points=12&proto=tcp&port=6379&from=" + url.QueryEscape(idNginx) + "&to=" + url.QueryEscape(idRedis)
	code, body, _ := get(t, srv.URL, q)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	var ans seriesAnswer
	if err := json.Unmarshal(body, &ans); err != nil {
		t.Fatal(err)
	}
	step := time.Duration(ans.StepS) * time.Second
	want := int((ans.Until.Sub(ans.Since) + step - 1) / step)
	if step%time.Minute != 0 || len(ans.Points) != want || len(ans.Points) > 13 || !ans.Since.Equal(ans.Since.Truncate(time.Minute)) {
		t.Fatalf("step %s, %d points over %s..%s: want %d whole-minute steps, at most 13", step, len(ans.Points), ans.Since, ans.Until, want)
	}
	var conns, failed uint64
	busy := 0
	for i, p := range ans.Points {
		if !p.T.Equal(ans.Since.Add(time.Duration(i) * step)) {
			t.Errorf("point %d at %s", i, p.T)
		}
		conns += p.Connections
		failed += p.FailedConnections
		if p.Connections > 0 {
			busy++
			if !p.Unhealthy {
				t.Errorf("the step with the failures is not unhealthy: %+v", p)
			}
		}
	}
	if conns != 5 || failed != 3 || busy != 1 {
		t.Errorf("series sums %d conns, %d failed over %d steps; want 5 and 3 in one step", conns, failed, busy)
	}
	for path, want := range map[string]string{
		"/api/series?from=a&to=b&proto=tcp":                 "invalid port",
		"/api/series?from=a&proto=tcp&port=1":               "missing from or to",
		"/api/series?from=a&to=b&proto=tcp&port=1&points=0": "allowed 1 to 120",
		"/api/series?from=a&to=b&port=1":                    "invalid proto",
		"/api/series?from=a&to=b&proto=tcp&port=1&x=1":      "allowed since, until, group_by, from, to, proto, port, points",
	} {
		code, body, _ := get(t, srv.URL, path)
		if code != http.StatusBadRequest || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %s, want 400 with %q", path, code, body, want)
		}
	}
}

// A time beyond what nanoseconds since 1970 hold in 64 bits (years
// before 1678 or after 2262) is a 400 naming the parameter, on every
// endpoint: it used to wrap around (since=2999-01-01 gave every edge,
// until=2999-01-01 none).
func TestTimesBeyondNanosecondsAreRefused(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	const allowed = "out of range: allowed a time from 1678-01-01T00:00:00Z to 2262-01-01T00:00:00Z (the store's nanoseconds since 1970 in 64 bits)"
	for q, param := range map[string]string{
		"/api/graph?since=2999-01-01":                                        `since "2999-01-01"`,
		"/api/graph?since=1h&until=2999-01-01":                               `until "2999-01-01"`,
		"/api/graph?until=2262-04-12":                                        `until "2262-04-12"`,
		"/api/graph?since=1600-01-01T00:00:00Z":                              `since "1600-01-01T00:00:00Z"`,
		"/api/look?target=nginx&since=2300-01-01":                            `since "2300-01-01"`,
		"/api/diff?since=2999-01-01":                                         `since "2999-01-01"`,
		"/api/diff?since=1h&before_since=1500-01-01":                         `before_since "1500-01-01"`,
		"/api/diff?since=1h&before_until=3000-01-01":                         `before_until "3000-01-01"`,
		"/api/series?node=" + url.QueryEscape(idNginx) + "&until=2999-01-01": `until "2999-01-01"`,
		"/api/dns?since=2300-01-01":                                          `since "2300-01-01"`,
	} {
		code, body, _ := get(t, srv.URL, q)
		var e struct{ Error string }
		if err := json.Unmarshal(body, &e); err != nil || code != http.StatusBadRequest || e.Error != "invalid "+param+": "+allowed {
			t.Errorf("GET %s: %d %s, want 400 with invalid %s: %s", q, code, body, param, allowed)
		}
	}
	// The bounds themselves read the store right: nothing was seen
	// after the last, everything after the first; and a range between
	// them (not on whole minutes: the store rounds it) has it all.
	for q, want := range map[string]int{"since=2262-01-01T00:00:00Z": 0, "until=2262-01-01T00:00:00Z": 4, "since=1678-01-01T00:00:00Z": 4,
		"until=1678-01-01T00:00:00Z": 0, "since=1678-01-01T00:00:01Z&until=2261-12-31T23:59:59Z": 4, "since=1678-01-01T00:00:00Z&until=1678-01-02T00:00:00Z": 0} {
		if g := getGraph(t, srv.URL, "/api/graph?"+q); len(g.Edges) != want {
			t.Errorf("%s: %d edges, want %d", q, len(g.Edges), want)
		}
	}
}

// /api/diff with one end of the window before: the other defaults as in
// the CLI's diff (cli.BeforeWindow): only before_since ends it at since,
// only before_until makes it as long as [since, until). It used to
// default to the zero time: no bound.
func TestDiffDefaultsTheMissingEndOfTheWindowBefore(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	keys := func(es []graph.Edge) []string { return edgeKeys(graph.Graph{Edges: es}) }
	ask := func(q string) diffAnswer {
		var ans diffAnswer
		code, body, _ := get(t, srv.URL, "/api/diff?"+q)
		if code != http.StatusOK || json.Unmarshal(body, &ans) != nil {
			t.Fatalf("diff?%s: %d %s", q, code, body)
		}
		return ans
	}
	// [2h ago, 30m ago): python3's edge, gone since; redis and DNS new.
	ans := ask("since=30m&before_since=2h")
	if !ans.BeforeUntil.Equal(ans.Since) || ans.Since.Sub(ans.BeforeSince) != 90*time.Minute {
		t.Errorf("before_since=2h: before [%s, %s), want [since - 90m, since %s)", ans.BeforeSince, ans.BeforeUntil, ans.Since)
	}
	equal(t, "appeared since the window [2h, 30m) ago", keys(ans.Appeared), []string{idNginx + " -> " + idRedis, idNginx + " -> " + idDNS})
	equal(t, "disappeared since the window [2h, 30m) ago", keys(ans.Disappeared), []string{idPython + " -> " + idPostgres})

	// [75m ago, 45m ago), as long as [30m ago, now): nothing then, so
	// all three edges of the last 30 minutes appeared.
	ans = ask("since=30m&before_until=45m")
	if ans.BeforeUntil.Sub(ans.BeforeSince) != ans.Until.Sub(ans.Since) || ans.Since.Sub(ans.BeforeUntil) != 15*time.Minute {
		t.Errorf("before_until=45m: before [%s, %s), want 30 minutes ending 15 minutes before since %s", ans.BeforeSince, ans.BeforeUntil, ans.Since)
	}
	equal(t, "appeared since the window [75m, 45m) ago", keys(ans.Appeared), []string{idNginx + " -> " + idPostgres, idNginx + " -> " + idRedis, idNginx + " -> " + idDNS})
	equal(t, "disappeared since the window [75m, 45m) ago", keys(ans.Disappeared), nil)

	// A window before that does not start before it ends is refused,
	// saying which end was defaulted.
	for q, want := range map[string]string{
		"since=30m&before_since=10m":                        "(before_until defaults to since): allowed a window that starts before it ends",
		"since=30m&until=20m&before_until=1000000d":         "invalid before_until",
		"since=2h&until=1h&before_since=3h&before_until=3h": "invalid range: before_since",
	} {
		code, body, _ := get(t, srv.URL, "/api/diff?"+q)
		var e struct{ Error string }
		if err := json.Unmarshal(body, &e); err != nil || code != http.StatusBadRequest || !strings.Contains(e.Error, want) {
			t.Errorf("diff?%s: %d %s, want 400 with %q", q, code, body, want)
		}
	}
}

// Any method but GET and HEAD on an endpoint is a 405 that says which
// are allowed (it was a 404 "no endpoint", as if the path were wrong);
// a path that is no endpoint stays a 404.
func TestMethodNotAllowed(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	type answer struct {
		method, path string
		code         int
		want         string // the JSON error
	}
	// The page and its files answer another method as an endpoint does,
	// in the same JSON; a path that is none of them is a JSON 404.
	cases := []answer{
		{http.MethodPost, "/", http.StatusMethodNotAllowed, "method POST not allowed on /: allowed GET, HEAD"},
		{http.MethodDelete, "/static/app.js", http.StatusMethodNotAllowed, "method DELETE not allowed on /static/app.js: allowed GET, HEAD"},
		{http.MethodGet, "/nothing", http.StatusNotFound, "no page /nothing: the service map is at /, its files under /static/, the API under /api/"},
		{http.MethodGet, "/static/nothing.js", http.StatusNotFound, "no file /static/nothing.js among the page's files"},
		{http.MethodGet, "/static/vendor/", http.StatusNotFound, "no file /static/vendor/ among the page's files"},
		{http.MethodPost, "/api/nothing", http.StatusNotFound, "no endpoint POST /api/nothing: allowed GET /api/graph, /api/look, /api/diff, /api/series, /api/dns"},
	}
	for _, ep := range []string{"/api/graph", "/api/look", "/api/diff", "/api/series", "/api/dns"} {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
			cases = append(cases, answer{m, ep + "?since=1h", http.StatusMethodNotAllowed, "method " + m + " not allowed on " + ep + ": allowed GET, HEAD"})
		}
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader("{}"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct{ Error string }
		if resp.StatusCode != c.code || json.Unmarshal(body, &e) != nil || e.Error != c.want {
			t.Errorf("%s %s: %d %s, want %d and %q", c.method, c.path, resp.StatusCode, body, c.code, c.want)
		}
		if c.code == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q, want GET, HEAD", c.method, c.path, resp.Header.Get("Allow"))
		}
	}
	// HEAD, which Allow names, works.
	resp, err := http.Head(srv.URL + "/api/graph?since=1h")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("HEAD /api/graph: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// GET of the page and of a file still work.
	for _, p := range []string{"/", "/static/app.js", "/static/vendor/README.md"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", p, resp.StatusCode)
		}
	}
}

// Every answer is JSON without indentation, one line and a newline, as
// /api/graph always was (docs/api.md says so).
func TestAnswersAreCompact(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	for _, q := range []string{"/api/graph?since=1h", "/api/look?target=nginx", "/api/diff?since=1h", "/api/dns",
		"/api/series?points=3&node=" + url.QueryEscape(idNginx),
		"/api/series?points=3&proto=tcp&port=6379&from=" + url.QueryEscape(idNginx) + "&to=" + url.QueryEscape(idRedis),
		"/api/graph?since=nope", "/api/series?node=nosuch"} {
		_, body, _ := get(t, srv.URL, q)
		var compact bytes.Buffer
		if err := json.Compact(&compact, body); err != nil || compact.String()+"\n" != string(body) {
			t.Errorf("GET %s: %.300q is not compact JSON and a newline (%v)", q, body, err)
		}
	}
}

// The token docs/api.md makes (hex: no character a query string
// changes) is one --token-file takes and one that works in the page's
// link as it is; a token with + / = works in the link URL-encoded, and
// not as it is (a + is a space in a query string).
func TestDocumentedTokenWorksInALink(t *testing.T) {
	file := t.TempDir() + "/token"
	if out, err := exec.Command("sh", "-c", "od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > "+file).CombinedOutput(); err != nil {
		t.Fatalf("the documented command: %v %s", err, out)
	}
	token, err := ReadToken(file)
	if err != nil || len(token) != 64 || strings.Trim(token, "0123456789abcdef") != "" {
		t.Fatalf("ReadToken of the documented token: %q %v; want 64 hex digits", token, err)
	}
	path, _ := seed(t)
	for _, c := range []struct {
		token, link string
		code        int
	}{
		{token, "/?token=" + token, http.StatusSeeOther},
		{"a+b/c=d+e/f=g+h/i==", "/?token=" + url.QueryEscape("a+b/c=d+e/f=g+h/i=="), http.StatusSeeOther},
		{"a+b/c=d+e/f=g+h/i==", "/?token=a+b/c=d+e/f=g+h/i==", http.StatusUnauthorized},
	} {
		srv, _ := serve(t, path, Options{Token: c.token})
		code, _, hdr := get(t, srv.URL, c.link)
		if code != c.code {
			t.Errorf("token %q, link %s: %d, want %d", c.token, c.link, code, c.code)
		}
		if code == http.StatusSeeOther {
			cookie := &http.Cookie{}
			if cs := (&http.Response{Header: hdr}).Cookies(); len(cs) == 1 {
				cookie = cs[0]
			}
			if code, body, _ := get(t, srv.URL, "/api/graph", "Cookie", cookie.Name+"="+cookie.Value); code != http.StatusOK {
				t.Errorf("token %q: the cookie of the link gives %d %.200s", c.token, code, body)
			}
		}
	}
}

// apiError is GET path's status and JSON error, failing the test when
// the answer is not one line of JSON.
func apiError(t *testing.T, srv, path string, hdr ...string) (int, string) {
	t.Helper()
	code, body, h := get(t, srv, path, hdr...)
	var e struct{ Error string }
	if err := json.Unmarshal(body, &e); err != nil || h.Get("Content-Type") != "application/json" || bytes.Count(body, []byte("\n")) != 1 {
		t.Errorf("GET %.100s: %d %q %.300q: not one line of JSON (%v)", path, code, h.Get("Content-Type"), body, err)
	}
	return code, e.Error
}

// A query string url.Values cannot read is a 400 naming the pair: Go's
// URL.Query() dropped such a pair, and with it a filter (since=%zz gave
// all history, target=% the whole graph) or an unknown parameter
// (a=1;b=2 was a 200, target=front;depth=2 "missing target").
func TestMalformedQueryStringIsRefused(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	const escape = ": allowed key=value pairs separated by &, percent-encoded (a % in a value is %25)"
	const semicolon = ` holds a ";": allowed key=value pairs separated by & (a ";" in a value is %3B)`
	for q, want := range map[string]string{
		"/api/graph?since=%zz":             `invalid query string: "since=%zz": invalid URL escape "%zz"` + escape,
		"/api/graph?target=%":              `invalid query string: "target=%": invalid URL escape "%"` + escape,
		"/api/graph?since=1h&%zz=1":        `invalid query string: "%zz=1": invalid URL escape "%zz"` + escape,
		"/api/graph?a=1;b=2":               `invalid query string: "a=1;b=2"` + semicolon,
		"/api/look?target=front;depth=2":   `invalid query string: "target=front;depth=2"` + semicolon,
		"/api/diff?since=1h&until=%4":      `invalid query string: "until=%4": invalid URL escape "%4"` + escape,
		"/api/dns?limit=1;failing":         `invalid query string: "limit=1;failing"` + semicolon,
		"/api/series?node=%zz&since=1h":    `invalid query string: "node=%zz": invalid URL escape "%zz"` + escape,
		"/api/graph?since=1h;x&target=%zz": `invalid query string: "since=1h;x"` + semicolon,
		// More pairs than url.ParseQuery reads gave no values at all.
		"/api/graph?target=nosuch" + strings.Repeat("&a", 10000): "invalid query string: number of URL query parameters exceeded limit (10001 pairs): allowed each parameter once",
	} {
		if code, e := apiError(t, srv.URL, q); code != http.StatusBadRequest || e != want {
			t.Errorf("GET %.100s: %d %q, want 400 %q", q, code, e, want)
		}
	}
	// Percent-encoded, the same characters are a value like any other.
	if code, e := apiError(t, srv.URL, "/api/graph?target=front%3Bdepth%3D2%25"); code != http.StatusNotFound ||
		e != `no host, address, service or process matches "front;depth=2%" in the selected time range` {
		t.Errorf("encoded ; = %%: %d %q", code, e)
	}
	// The page reads its query as before: a pair it cannot read does
	// not stop the token of the link from working.
	const token = "s3cret-token-0123456789"
	tsrv, _ := serve(t, path, Options{Token: token})
	for link, to := range map[string]string{"/?view=table;x=1&token=" + token: "/", "/?since=%zz&view=table&token=" + token: "/?view=table"} {
		if code, _, hdr := get(t, tsrv.URL, link); code != http.StatusSeeOther || hdr.Get("Location") != to || !strings.Contains(hdr.Get("Set-Cookie"), tokenCookie+"="+token) {
			t.Errorf("GET %s: %d to %q, cookie %q; want 303 to %s with the cookie", link, code, hdr.Get("Location"), hdr.Get("Set-Cookie"), to)
		}
	}
}

// An error repeats a value the user gave cut to its first 200 bytes
// (whole characters) and its length: a 100 KB target came back whole.
func TestErrorsCutLongValues(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	long := strings.Repeat("a", 100000)
	head := `"` + strings.Repeat("a", 200) + `"… (100000 bytes)`
	for q, want := range map[string]struct {
		code int
		err  string
	}{
		"/api/graph?target=" + long:                    {404, "no host, address, service or process matches " + head + " in the selected time range"},
		"/api/look?target=" + long:                     {404, "no host, address, service or process matches " + head + " in the selected time range"},
		"/api/diff?since=1h&target=" + long:            {404, "no host, address, service or process matches " + head + " in the selected time range"},
		"/api/graph?since=" + long:                     {400, "invalid since " + head + ": " + cli.TimeForms},
		"/api/graph?depth=" + long:                     {400, "invalid depth " + head + ": allowed 0 (unlimited) to 1000"},
		"/api/graph?" + long + "=1":                    {400, "unknown parameter " + head + ": allowed since, until, target, depth, reverse, proto, port, group_by, format"},
		"/api/dns?resolver=" + long:                    {400, "invalid resolver " + head + ": allowed ADDRESS:PORT, such as 127.0.0.53:53 or [2001:db8::53]:53"},
		"/api/series?node=" + long[:1000]:              {404, `unknown node "` + strings.Repeat("a", 200) + `"… (1000 bytes): no such node in the store (group_by workload); allowed a node id as /api/graph gives it`},
		"/api/series?from=a&to=b&port=1&proto=" + long: {400, "invalid proto " + head + ": allowed tcp, udp, unix"},
		"/" + long:     {404, "no page /" + strings.Repeat("a", 199) + "… (100001 bytes): the service map is at /, its files under /static/, the API under /api/"},
		"/api/" + long: {404, "no endpoint GET /api/" + strings.Repeat("a", 195) + "… (100005 bytes): allowed GET /api/graph, /api/look, /api/diff, /api/series, /api/dns"},
	} {
		if code, e := apiError(t, srv.URL, q); code != want.code || e != want.err {
			t.Errorf("GET %.60s…: %d %.400q, want %d %.400q", q, code, e, want.code, want.err)
		}
	}
	// The cut falls between characters: "a" and 4-byte emoji end on 197
	// bytes, the emoji across byte 200 left out.
	v := "a" + strings.Repeat("😀", 1000)
	if got, want := quote(v), strconv.Quote(v[:197])+"… (4001 bytes)"; got != want {
		t.Errorf("quote of a long emoji value: %q, want %q", got, want)
	}
	if got := quote(long[:200]); got != `"`+long[:200]+`"` {
		t.Errorf("quote of 200 bytes: %q, want it whole", got)
	}
	// Invalid UTF-8 is cut 3 bytes back, where a character would start
	// at the latest, not searched back to nothing.
	if got, want := quote(strings.Repeat("\x80", 300)), strconv.Quote(strings.Repeat("\x80", 197))+"… (300 bytes)"; got != want {
		t.Errorf("quote of invalid UTF-8: %q, want %q", got, want)
	}
}

// The bearer scheme is matched ignoring case (RFC 7235): "bearer TOKEN"
// was a 401.
func TestBearerSchemeIgnoresCase(t *testing.T) {
	const token = "s3cret-token-0123456789"
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{Token: token})
	for _, auth := range []string{"Bearer " + token, "bearer " + token, "BEARER " + token, "bEaReR  " + token} {
		if code, body, _ := get(t, srv.URL, "/api/graph", "Authorization", auth); code != http.StatusOK {
			t.Errorf("Authorization %q: %d %.200s, want 200", auth, code, body)
		}
	}
	for _, auth := range []string{"Basic " + token, "bearer" + token, "bearers " + token, "bearer", "bearer " + token + " x", token} {
		if code, e := apiError(t, srv.URL, "/api/graph", "Authorization", auth); code != http.StatusUnauthorized || !strings.HasPrefix(e, "missing or wrong token") {
			t.Errorf("Authorization %q: %d %q, want 401", auth, code, e)
		}
	}
}

// A path the mux would clean (an empty, "." or ".." segment) is
// deptrace's JSON 404 naming the path to use, and /api and /static, which
// it would send on to /api/ and /static/, the 404 of any other path:
// each was a 307 with an HTML body. The redirects deptrace makes itself
// have a JSON body too.
func TestUncleanPathsAnswerJSON(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	for q, want := range map[string]string{
		"//api/graph?since=1h":     `path //api/graph has an empty, "." or ".." segment: allowed its clean form, /api/graph`,
		"/static/../api/graph":     `path /static/../api/graph has an empty, "." or ".." segment: allowed its clean form, /api/graph`,
		"/api/./look?target=nginx": `path /api/./look has an empty, "." or ".." segment: allowed its clean form, /api/look`,
		"/static//app.js":          `path /static//app.js has an empty, "." or ".." segment: allowed its clean form, /static/app.js`,
		"/static/vendor/../":       `path /static/vendor/../ has an empty, "." or ".." segment: allowed its clean form, /static/`,
		"/api/graph%2F..%2F..":     "no endpoint GET /api/graph/../..: allowed GET /api/graph, /api/look, /api/diff, /api/series, /api/dns",
		"/api":                     "no page /api: the service map is at /, its files under /static/, the API under /api/",
		"/static?x=1":              "no page /static: the service map is at /, its files under /static/, the API under /api/",
	} {
		if code, e := apiError(t, srv.URL, q); code != http.StatusNotFound || e != want {
			t.Errorf("GET %s: %d %q, want 404 %q", q, code, e, want)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/static/../api/graph", nil)
	if req.URL.EscapedPath() != "/static/../api/graph" {
		t.Fatalf("the client cleaned the path: %s", req.URL.EscapedPath())
	}
	// deptrace's own redirects.
	code, body, hdr := get(t, srv.URL, "/static/index.html?since=1h")
	if code != http.StatusMovedPermanently || hdr.Get("Location") != "/?since=1h" || hdr.Get("Content-Type") != "application/json" || string(body) != `{"location":"/?since=1h"}`+"\n" {
		t.Errorf("GET /static/index.html?since=1h: %d to %q, %q %q", code, hdr.Get("Location"), hdr.Get("Content-Type"), body)
	}
	const token = "s3cret-token-0123456789"
	tsrv, _ := serve(t, path, Options{Token: token})
	code, body, hdr = get(t, tsrv.URL, "/?view=table&token="+token)
	if code != http.StatusSeeOther || hdr.Get("Location") != "/?view=table" || hdr.Get("Content-Type") != "application/json" || string(body) != `{"location":"/?view=table"}`+"\n" {
		t.Errorf("GET /?token=: %d to %q, %q %q", code, hdr.Get("Location"), hdr.Get("Content-Type"), body)
	}
	// An unclean path is refused before the token is read: the token's
	// redirect (to the same path, less the token) must not lead from
	// "//evil.example/" to another site.
	if code, e := apiError(t, tsrv.URL, "//api/graph"); code != http.StatusNotFound || !strings.HasPrefix(e, "path //api/graph has an empty") {
		t.Errorf("GET //api/graph without the token: %d %q", code, e)
	}
	if code, _, hdr := get(t, tsrv.URL, "//evil.example/?token="+token); code != http.StatusNotFound || hdr.Get("Location") != "" {
		t.Errorf("GET //evil.example/?token=: %d to %q; want a 404 and no redirect", code, hdr.Get("Location"))
	}
}

// since and until the wrong way round say what is allowed, with the
// ages of the mistake the right way round, which works.
func TestRangeBackwardsSaysWhatIsAllowed(t *testing.T) {
	path, _ := seed(t)
	now := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	srv, _ := serve(t, path, Options{Now: func() time.Time { return now }})
	const want = "invalid range: since 2026-11-25T19:00:00Z is not before until 2026-11-25T18:00:00Z: allowed a since before until (an age counts back from now: since=2h&until=1h is the hour from two hours ago to one hour ago)"
	for _, q := range []string{"/api/graph?since=1h&until=2h", "/api/look?target=nginx&since=1h&until=2h", "/api/diff?since=1h&until=2h", "/api/dns?since=1h&until=2h",
		"/api/series?since=1h&until=2h&node=" + url.QueryEscape(idNginx)} {
		if code, e := apiError(t, srv.URL, q); code != http.StatusBadRequest || e != want {
			t.Errorf("GET %s: %d %q, want 400 %q", q, code, e, want)
		}
	}
	if code, body, _ := get(t, srv.URL, "/api/graph?since=2h&until=1h"); code != http.StatusOK {
		t.Errorf("the example, since=2h&until=1h: %d %.200s", code, body)
	}
}

// A window before that is empty because its defaulted start is held at
// the earliest time the store keeps says which ends were defaulted, and
// from what: it named before_since and before_until, never given. The
// sentence is cli.BeforeWindow's, as the CLI's diff prints it with its
// flags' names (cmd/deptrace's TestDiffRefusesABackwardWindow).
func TestDiffSaysWhichEndsWereDefaulted(t *testing.T) {
	path, _ := seed(t)
	srv, _ := serve(t, path, Options{})
	for q, want := range map[string]string{
		"since=1678-01-01T00:00:00Z&until=1678-01-02T00:00:00Z": "invalid range: before_since 1678-01-01T00:00:00Z is not before before_until 1678-01-01T00:00:00Z (neither was given: before_until defaults to since, before_since to before_until minus the length of [since, until), no earlier than 1678-01-01T00:00:00Z): allowed a since after 1678-01-01T00:00:00Z, or before_since and before_until",
		"since=1h&before_until=1678-01-01T00:00:00Z":            "invalid range: before_since 1678-01-01T00:00:00Z is not before before_until 1678-01-01T00:00:00Z (before_since defaults to before_until minus the length of [since, until), no earlier than 1678-01-01T00:00:00Z): allowed a before_until after 1678-01-01T00:00:00Z",
		// Given, or defaulted from a given before_since: as the CLI says it.
		"since=1678-01-01T00:00:00Z&until=1678-01-02T00:00:00Z&before_since=1678-01-01T00:00:00Z&before_until=1678-01-01T00:00:00Z": "invalid range: before_since 1678-01-01T00:00:00Z is not before before_until 1678-01-01T00:00:00Z: allowed a window that starts before it ends",
		"since=1678-01-01T00:00:00Z&until=1678-01-02T00:00:00Z&before_since=1678-01-01T00:00:00Z":                                   "invalid range: before_since 1678-01-01T00:00:00Z is not before before_until 1678-01-01T00:00:00Z (before_until defaults to since): allowed a window that starts before it ends",
	} {
		if code, e := apiError(t, srv.URL, "/api/diff?"+q); code != http.StatusBadRequest || e != want {
			t.Errorf("diff?%s: %d %q, want 400 %q", q, code, e, want)
		}
	}
	// A since after the earliest time has room for the window before.
	if code, body, _ := get(t, srv.URL, "/api/diff?since=1678-01-01T00:00:01Z&until=1678-01-02T00:00:00Z"); code != http.StatusOK {
		t.Errorf("since a second after the earliest time: %d %.200s", code, body)
	}
}
