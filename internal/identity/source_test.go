package identity

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// logBuffer collects a logger's lines from several goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines returns the lines that contain msg.
func (l *logBuffer) lines(msg string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, msg) {
			out = append(out, line)
		}
	}
	return out
}

func newLogBuffer() (*logBuffer, *slog.Logger) {
	var b logBuffer
	return &b, slog.New(slog.NewTextHandler(&b, nil))
}

// eventually waits for cond, failing the test after a long deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fakeDocker serves the Engine API endpoints the client uses on a unix
// socket: the event stream (held open until the connection closes), the
// list of running containers (none), inspection of the containers in
// names, and the version.
func fakeDocker(t *testing.T, sock string, names map[string]string, streams chan<- struct{}) *http.Server {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		streams <- struct{}{}
		<-r.Context().Done()
	})
	mux.HandleFunc("/containers/json", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("[]")) })
	mux.HandleFunc("/containers/{id}/json", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		name, ok := names[id]
		if !ok {
			http.Error(w, "no such container", http.StatusNotFound)
			return
		}
		var resp inspectResponse
		resp.ID, resp.Name, resp.Config.Image = id, "/"+name, "busybox"
		_ = json.NewEncoder(w).Encode(resp) // a test server's reply
	})
	mux.HandleFunc("/version", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"Version":"99.0.1","ApiVersion":"1.99"}`))
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }() // ends with Close
	t.Cleanup(func() { srv.Close() })
	return srv
}

// cgroupDir makes a cgroup-like directory under root and returns its
// inode, the id the resolver knows it by.
func cgroupDir(t *testing.T, root, rel string) uint64 {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// Docker stops answering while the resolver follows it: one warning
// naming the socket and the error, however many reconnects fail; the
// containers it named keep their names and new ones carry their id only;
// when it answers again, one line says so and new containers are named.
func TestRuntimeLossWarnedOnceAndRecoveryOnce(t *testing.T) {
	saved := streamRetry
	streamRetry = [2]time.Duration{5 * time.Millisecond, 20 * time.Millisecond}
	t.Cleanup(func() { streamRetry = saved })

	const (
		idA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		idB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
		idC = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	)
	root := t.TempDir()
	cgA, cgB, cgC := cgroupDir(t, root, "docker/"+idA), cgroupDir(t, root, "docker/"+idB), cgroupDir(t, root, "docker/"+idC)
	sock := filepath.Join(t.TempDir(), "docker.sock")
	names := map[string]string{idA: "web", idC: "api"}
	streams := make(chan struct{}, 16)
	srv := fakeDocker(t, sock, names, streams)

	logs, log := newLogBuffer()
	cfg := Config{CgroupRoot: root, DockerSocket: sock, Retain: time.Minute, Timeout: 2 * time.Second, Log: log}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	<-streams
	if id := r.Resolve(cgA); id.ContainerName != "web" {
		t.Fatalf("before the loss: %+v", id)
	}

	// dockerd stops: its socket goes, then a socket file is there that
	// closes every connection at once (a runtime that is not serving).
	srv.Close()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			attempts.Add(1)
			c.Close()
		}
	}()
	eventually(t, "the warning", func() bool { return len(logs.lines(msgUnreachable)) > 0 })
	seen := attempts.Load()
	eventually(t, "three more reconnects", func() bool { return attempts.Load() >= seen+3 })
	if id := r.Resolve(cgB); id.ContainerID != idB || id.ContainerRuntime != RuntimeDocker || id.ContainerName != "" {
		t.Errorf("a container not named before the loss: %+v, want its id only", id)
	}
	if id := r.Resolve(cgA); id.ContainerName != "web" {
		t.Errorf("a container named before the loss: %+v, want its name kept", id)
	}
	warns := logs.lines(msgUnreachable)
	if len(warns) != 1 || !strings.Contains(warns[0], "level=WARN") || !strings.Contains(warns[0], "runtime=docker socket="+sock+" err=") {
		t.Fatalf("want one warning naming the runtime, socket and error, got:\n%s", logs)
	}
	if len(logs.lines(msgAnswerAgain)) != 0 {
		t.Fatalf("recovery said while down:\n%s", logs)
	}

	// dockerd is back.
	ln.Close()
	fakeDocker(t, sock, names, streams)
	<-streams
	eventually(t, "the recovery line", func() bool { return len(logs.lines(msgAnswerAgain)) > 0 })
	if id := r.Resolve(cgC); id.ContainerName != "api" {
		t.Errorf("a new container after the return: %+v, want it named", id)
	}
	back := logs.lines(msgAnswerAgain)
	if len(back) != 1 || !strings.Contains(back[0], "level=INFO") || !strings.Contains(back[0], "runtime=docker socket="+sock+" down=") ||
		len(logs.lines(msgUnreachable)) != 1 {
		t.Errorf("want one warning and one recovery line, got:\n%s", logs)
	}
	t.Logf("log:\n%s", logs)
}

// A socket path that holds a regular file (--docker-socket /etc/passwd)
// is warned of at start, and never connected to.
func TestRuntimeSocketThatIsNoSocketWarns(t *testing.T) {
	file := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(file, []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	logs, log := newLogBuffer()
	r, err := New(Config{CgroupRoot: t.TempDir(), DockerSocket: file, Retain: time.Minute, Timeout: time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	eventually(t, "the warning", func() bool { return len(logs.lines(msgUnreachable)) > 0 })
	if w := logs.lines(msgUnreachable); len(w) != 1 || !strings.Contains(w[0], `err="`+file+` is not a socket (a regular file)"`) {
		t.Errorf("want one warning saying it is no socket, got:\n%s", logs)
	}
}

// Which failures are said, and how: a socket that is simply not there is
// silent unless it was asked for (info), its containers need it, or it
// answered before (warnings); anything else that does not answer warns.
// Each outage says one thing, and an answer after a line says so.
func TestSourceSaysEachOutageOnce(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.sock")
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mountDir := filepath.Join(dir, "dir.sock") // what docker -v makes for a missing source
	if err := os.Mkdir(mountDir, 0o755); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(dir, "dead.sock")
	l, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	errOf := func(path string) error {
		if err := checkSocket(path); err != nil {
			return err
		}
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			t.Fatalf("%s answers", path)
		}
		return err
	}
	const (
		fail   = "fail"   // a failure the event stream saw
		lookup = "lookup" // a failure a container's lookup saw
		ok     = "ok"
	)
	for _, c := range []struct {
		name           string
		path           string
		asked, present bool
		steps          []string
		want           []string // "LEVEL msg" per line, in order
	}{
		{"default socket not there", missing, false, false, []string{fail, fail, fail, ok}, nil},
		{"default socket a directory", mountDir, false, false, []string{fail, fail}, nil},
		{"asked socket not there", missing, true, false, []string{fail, fail, ok}, []string{"INFO " + msgNotThere, "INFO " + msgAnswers}},
		{"asked, then a container needs it", missing, true, false, []string{fail, lookup, lookup, fail}, []string{"INFO " + msgNotThere, "WARN " + msgUnreachable}},
		{"not there while its containers run", missing, false, true, []string{fail, fail}, []string{"WARN " + msgUnreachable}},
		{"not there when a container needs it", missing, false, false, []string{fail, lookup, lookup}, []string{"WARN " + msgUnreachable}},
		{"there but refusing", dead, false, false, []string{fail, fail, ok}, []string{"WARN " + msgUnreachable, "INFO " + msgAnswers}},
		{"a regular file", file, false, false, []string{fail, fail}, []string{"WARN " + msgUnreachable}},
		{"lost and back, twice", missing, false, false, []string{ok, fail, fail, lookup, ok, fail, ok},
			[]string{"WARN " + msgUnreachable, "INFO " + msgAnswerAgain, "WARN " + msgUnreachable, "INFO " + msgAnswerAgain}},
	} {
		logs, log := newLogBuffer()
		s := newSource(RuntimeDocker, c.path, c.asked, log)
		s.present = c.present
		for _, step := range c.steps {
			switch step {
			case fail:
				s.failed(errOf(c.path), false)
			case lookup:
				s.failedWhileDown(errOf(c.path))
			case ok:
				s.ok()
			}
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			if line == "" {
				continue
			}
			rec := map[string]string{}
			for _, k := range []string{"level", "msg"} {
				_, v, _ := strings.Cut(line, k+"=")
				if strings.HasPrefix(v, `"`) {
					v = v[1 : strings.Index(v[1:], `"`)+1]
				} else {
					v, _, _ = strings.Cut(v, " ")
				}
				rec[k] = v
			}
			got = append(got, rec["level"]+" "+rec["msg"])
		}
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s: got lines\n%s\nwant\n%s", c.name, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
}

// The error a refused connect gives is a dial error, not a missing socket.
func TestNoSocket(t *testing.T) {
	if noSocket(errors.New("dial unix /x: connect: connection refused")) {
		t.Error("a refused connect counted as no socket")
	}
	if !noSocket(&notSocketError{path: "/x", mode: os.ModeDir}) || noSocket(&notSocketError{path: "/x"}) {
		t.Error("a directory is no socket, a regular file is a misconfiguration")
	}
}

// A runtime that hangs (dockerd stopped with SIGSTOP) keeps its event
// stream open and silent: a lookup that gets no answer in time warns
// once, and the next answer says it answers again.
func TestHungRuntimeWarnedByItsLookups(t *testing.T) {
	const idA = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var hung atomic.Bool
	hung.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("/containers/{id}/json", func(w http.ResponseWriter, r *http.Request) {
		if hung.Load() {
			<-r.Context().Done() // no answer: the client gives up
			return
		}
		_, _ = w.Write([]byte(`{"Id":"` + r.PathValue("id") + `","Name":"/web","Config":{"Image":"busybox"},"State":{"Pid":0}}`))
	})
	mux.HandleFunc("/version", func(w http.ResponseWriter, r *http.Request) {
		if hung.Load() {
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte(`{"Version":"99.0.1","ApiVersion":"1.99"}`))
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }() // ends with Close below
	defer srv.Close()

	logs, log := newLogBuffer()
	src := newSource(RuntimeDocker, sock, false, log)
	src.ok() // its event stream connected and stays open
	d := newDockerClient(src, time.Minute, 100*time.Millisecond)
	for range 3 {
		if _, err := d.lookup(context.Background(), idA); err == nil {
			t.Fatal("a hung runtime answered")
		}
	}
	if w := logs.lines(msgUnreachable); len(w) != 1 || !strings.Contains(w[0], "level=WARN") {
		t.Fatalf("want one warning for three lookups that got no answer, got:\n%s", logs)
	}
	hung.Store(false)
	if c, err := d.lookup(context.Background(), idA); err != nil || c.name != "web" {
		t.Fatalf("after it answers again: %+v %v", c, err)
	}
	if back := logs.lines(msgAnswerAgain); len(back) != 1 {
		t.Errorf("want one line saying it answers again, got:\n%s", logs)
	}
}

// One container's inspect can hang alone while the runtime answers the
// rest (dockerd holds the container's lock while it stops it): no
// warning, however many times its lookup is retried.
func TestOneHungContainerIsNoOutage(t *testing.T) {
	const idStuck = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/containers/{id}/json", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == idStuck {
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte(`{"Id":"` + r.PathValue("id") + `","Name":"/web","Config":{"Image":"busybox"},"State":{"Pid":0}}`))
	})
	mux.HandleFunc("/version", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"Version":"99.0.1","ApiVersion":"1.99"}`))
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }() // ends with Close below
	defer srv.Close()

	logs, log := newLogBuffer()
	src := newSource(RuntimeDocker, sock, false, log)
	src.ok()
	d := newDockerClient(src, time.Minute, 100*time.Millisecond)
	for range 3 {
		if _, err := d.lookup(context.Background(), idStuck); err == nil {
			t.Fatal("the stuck container's inspect answered")
		}
	}
	if n := len(logs.lines(msgUnreachable)) + len(logs.lines(msgAnswerAgain)); n != 0 {
		t.Errorf("one stuck container made %d outage lines:\n%s", n, logs)
	}
}
