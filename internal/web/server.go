// Package web is deptrace serve: a JSON API over the store (the graph,
// look and diff the CLI prints) and the service-map page, embedded in the
// binary with its vendored JavaScript.
package web

import (
	"compress/gzip"
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
)

// DefaultListen is where deptrace serve listens unless told otherwise.
const DefaultListen = "127.0.0.1:7777"

//go:embed static
var staticFS embed.FS

// tokenCookie carries the bearer token for the page, which a browser cannot
// send as a header when following a link.
const tokenCookie = "deptrace_token"

// Options configure the handler.
type Options struct {
	// Token, when not empty, must come with every request: an
	// "Authorization: Bearer TOKEN" header, or the cookie the page sets
	// after being opened once with ?token=TOKEN.
	Token string
	Log   *slog.Logger
	// Now is the clock relative times (since=1h) are read against; nil
	// is time.Now.
	Now func() time.Time
	// Health are the thresholds that make an edge unhealthy; the zero
	// value is graph.DefaultHealth.
	Health graph.Health
	// DNSHealth are the thresholds that make a client's lookups through
	// a resolver unhealthy; the zero value is graph.DefaultDNSHealth.
	DNSHealth graph.DNSHealth
}

// Server answers the API and serves the page.
type Server struct {
	st     *store.Store
	token  []byte
	log    *slog.Logger
	now    func() time.Time
	health graph.Health
	dns    graph.DNSHealth
	mux    *http.ServeMux
	// seen is what all history held, for /api/series's 404 (known).
	seen everSeenCache
}

// New returns the handler of deptrace serve over st.
func New(st *store.Store, opt Options) *Server {
	s := &Server{st: st, log: opt.Log, now: opt.Now, health: opt.Health, dns: opt.DNSHealth, mux: http.NewServeMux()}
	if s.health == (graph.Health{}) {
		s.health = graph.DefaultHealth
	}
	if s.dns == (graph.DNSHealth{}) {
		s.dns = graph.DefaultDNSHealth
	}
	if opt.Token != "" {
		s.token = []byte(opt.Token)
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.now == nil {
		s.now = time.Now
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	endpoints := map[string]http.HandlerFunc{"/api/graph": s.handleGraph, "/api/look": s.handleLook, "/api/diff": s.handleDiff,
		"/api/series": s.handleSeries, "/api/dns": s.handleDNS}
	for path, h := range endpoints {
		s.mux.HandleFunc("GET "+path, h) // and HEAD
	}
	// Any other method on an endpoint is a 405 naming the allowed ones
	// (the mux would answer it so, but "/api/" below matches first); any
	// other path under /api/ a 404.
	s.mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		if endpoints[r.URL.Path] != nil {
			w.Header().Set("Allow", "GET, HEAD")
			s.fail(w, r, &httpError{http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: allowed GET, HEAD", clip(r.Method), r.URL.Path)})
			return
		}
		s.fail(w, r, &httpError{http.StatusNotFound, fmt.Sprintf("no endpoint %s %s: allowed GET /api/graph, /api/look, /api/diff, /api/series, /api/dns", clip(r.Method), clip(r.URL.Path))})
	})
	files := http.FileServerFS(static)
	s.mux.HandleFunc("GET /static/{file...}", func(w http.ResponseWriter, r *http.Request) {
		// The page itself lives at /: its file here leads there (the file
		// server would send it to /static/, which lists nothing).
		if r.PathValue("file") == "index.html" {
			u := url.URL{Path: "/", RawQuery: r.URL.RawQuery}
			s.redirect(w, r, u.RequestURI(), http.StatusMovedPermanently)
			return
		}
		// Files only, no directory listing, and a missing one gets the
		// JSON 404 every other answer has.
		if fi, err := fs.Stat(static, r.PathValue("file")); err != nil || fi.IsDir() {
			s.fail(w, r, &httpError{http.StatusNotFound, fmt.Sprintf("no file %s among the page's files", clip(r.URL.Path))})
			return
		}
		http.StripPrefix("/static/", files).ServeHTTP(w, r)
	})
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, static, "index.html")
	})
	// What the two above leave: another method on the page or its files
	// (a 405, as on an endpoint), or a path that is neither (a 404), each
	// with deptrace's JSON error rather than the mux's plain text.
	other := func(w http.ResponseWriter, r *http.Request) {
		if (r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, "/static/")) && r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			s.fail(w, r, &httpError{http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: allowed GET, HEAD", clip(r.Method), clip(r.URL.Path))})
			return
		}
		s.fail(w, r, &httpError{http.StatusNotFound, fmt.Sprintf("no page %s: the service map is at /, its files under /static/, the API under /api/", clip(r.URL.Path))})
	}
	s.mux.HandleFunc("/", other)
	// Without these the mux would send /api and /static to /api/ and
	// /static/ (neither of them a page) with a 307 and an HTML body.
	s.mux.HandleFunc("/api", other)
	s.mux.HandleFunc("/static", other)
	return s
}

// ServeHTTP checks the request's origin and token, then dispatches.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.log.Error("handler panic", "path", r.URL.Path, "panic", v)
			s.fail(w, r, fmt.Errorf("internal error: %v", v))
		}
	}()
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; frame-ancestors 'none'")
	// The mux would send a path with an empty, "." or ".." segment
	// (//api/graph, /static/../api/graph) to its clean form with a 307
	// and an HTML body: name the path to use instead, in JSON, so that a
	// script's mistake shows rather than costing a redirect each time.
	// Before the token's check, whose redirect to the same path less the
	// token would send the browser from "//host/..." to another site.
	if p := r.URL.EscapedPath(); r.Method != http.MethodConnect && cleanPath(p) != p {
		s.fail(w, r, &httpError{http.StatusNotFound, fmt.Sprintf("path %s has an empty, \".\" or \"..\" segment: allowed its clean form, %s", clip(p), clip(cleanPath(p)))})
		return
	}
	if s.token == nil {
		// Without a token the server is on loopback only: refuse other
		// Host names so that a web page cannot reach it by DNS rebinding.
		if !loopbackHost(r.Host) {
			s.fail(w, r, &httpError{http.StatusForbidden, fmt.Sprintf("host %s is not a loopback name: open the page through 127.0.0.1, [::1] or localhost", quote(r.Host))})
			return
		}
	} else if !s.authorized(w, r) {
		return
	}
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") && r.Method != http.MethodHead {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		gw := &gzipWriter{ResponseWriter: w}
		defer gw.close()
		w = gw
	}
	s.mux.ServeHTTP(w, r)
}

// cleanPath is p as the mux cleans it: without empty, "." and ".."
// segments, keeping a final slash.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// redirect is http.Redirect with a JSON body naming where to, as every
// answer is JSON (http.Redirect writes HTML, or nothing once the
// Content-Type is set).
func (s *Server) redirect(w http.ResponseWriter, r *http.Request, to string, code int) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, to, code)
	_ = json.NewEncoder(w).Encode(map[string]string{"location": w.Header().Get("Location")})
}

// authorized checks the bearer token (constant time). A page opened with a
// valid ?token= gets it as a cookie and is sent to the same address
// without it, so the token leaves the address bar and the history.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	// The scheme is case-insensitive (RFC 7235): "bearer" is "Bearer".
	if scheme, t, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") && s.tokenOK(strings.TrimLeft(t, " ")) {
		return true
	}
	if c, err := r.Cookie(tokenCookie); err == nil && s.tokenOK(c.Value) {
		return true
	}
	// The page's query is the page's: a pair that does not parse is left
	// out (the API refuses it, in newQuery), the token still read.
	v, _ := url.ParseQuery(r.URL.RawQuery)
	if t := v.Get("token"); t != "" && r.Method == http.MethodGet && !strings.HasPrefix(r.URL.Path, "/api/") && s.tokenOK(t) {
		http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		u := *r.URL
		v.Del("token")
		u.RawQuery = v.Encode()
		s.redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="deptrace"`)
	s.fail(w, r, &httpError{http.StatusUnauthorized, "missing or wrong token: send \"Authorization: Bearer TOKEN\" with the token of --token-file, or open the page once with ?token=TOKEN (URL-encoded)"})
	return false
}

func (s *Server) tokenOK(t string) bool {
	return subtle.ConstantTimeCompare([]byte(t), s.token) == 1
}

// gzipWriter compresses a response body, fast rather than small: a
// graph of 50,000 edges is tens of megabytes of JSON.
type gzipWriter struct {
	http.ResponseWriter
	gz      *gzip.Writer
	plain   bool // a status without a body
	started bool
}

func (g *gzipWriter) Write(b []byte) (int, error) {
	if !g.started {
		g.WriteHeader(http.StatusOK)
	}
	if g.plain {
		return g.ResponseWriter.Write(b)
	}
	if g.gz == nil {
		g.gz, _ = gzip.NewWriterLevel(g.ResponseWriter, gzip.BestSpeed)
	}
	return g.gz.Write(b)
}

// WriteHeader drops any length computed for the uncompressed body.
func (g *gzipWriter) WriteHeader(code int) {
	if g.started {
		return
	}
	g.started = true
	g.Header().Del("Content-Length")
	if code == http.StatusNotModified || code == http.StatusNoContent || code < 200 {
		g.plain = true
		g.Header().Del("Content-Encoding")
	}
	g.ResponseWriter.WriteHeader(code)
}

func (g *gzipWriter) close() {
	if g.gz != nil {
		_ = g.gz.Close() // flushes to the client; an error means it went away
	}
}

// httpError is an error with its status.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// fail answers {"error": "..."} with the status err calls for: 400 for a
// bad parameter, 404 for a target that matches nothing, 503 when the store
// cannot answer, 500 otherwise.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	var pe *paramError
	var nf *notFoundError
	var he *httpError
	switch {
	case errors.As(err, &pe):
		code = http.StatusBadRequest
	case errors.As(err, &nf):
		code = http.StatusNotFound
	case errors.As(err, &he):
		code = he.code
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusServiceUnavailable
	default:
		s.log.Error("request failed", "path", r.URL.Path, "err", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": strings.Join(strings.Fields(err.Error()), " ")})
}

// json writes v without indentation, as /api/graph writes the graph:
// one line and a newline.
func (s *Server) json(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		s.log.Debug("write answer", "err", err)
	}
}

// loopbackHost reports whether a Host header names this machine's
// loopback interface.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// CheckListen validates --listen, and refuses an address beyond loopback
// unless a token protects it.
func CheckListen(listen string, haveToken bool) error {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("invalid --listen %q: allowed HOST:PORT, e.g. %s", listen, DefaultListen)
	}
	if _, err := net.LookupPort("tcp", port); err != nil || port == "" {
		return fmt.Errorf("invalid --listen %q: port %q is not a port number 0 to 65535", listen, port)
	}
	if !haveToken && !loopbackHost(host) {
		return fmt.Errorf("--listen %s is beyond loopback: --token-file is required (a file holding the bearer token every request must carry)", listen)
	}
	return nil
}

// ReadToken reads the bearer token from --token-file: its content without
// surrounding white space, at least 16 characters.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read --token-file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 || strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("invalid --token-file %s: allowed one token of 16 or more characters without spaces", path)
	}
	return t, nil
}

// Serve answers on ln until ctx ends, then shuts down gracefully.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	return nil
}
