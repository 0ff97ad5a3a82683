package identity

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// podman's Docker-compatible event stream says "remove" where Docker says
// "destroy": a removed podman container must be marked gone (and so
// forgotten after the retain window), not kept for ever. The lines are
// podman 4.3's own (Debian 12), recorded from GET /events.
func TestEventStreamMarksRemovedContainersGone(t *testing.T) {
	const (
		podmanID = "9cbc170f364281c084bbf79b3abe0f9aef00ad2cc16e5927cb5a78d049e52ee5"
		dockerID = "b5568a0de9ccc0b1b71b422193d056d9686e100ff1a220e10989b06116de5420"
	)
	stream := `{"status":"create","id":"` + podmanID + `","from":"localhost/deptrace-test/busybox:1","Type":"container","Action":"create","Actor":{"ID":"` + podmanID + `","Attributes":{"containerExitCode":"0","image":"localhost/deptrace-test/busybox:1","name":"pm1","podId":""}},"scope":"local","time":1795649793,"timeNano":1795649793000000000}
{"status":"remove","id":"` + podmanID + `","from":"localhost/deptrace-test/busybox:1","Type":"container","Action":"remove","Actor":{"ID":"` + podmanID + `","Attributes":{"containerExitCode":"0","image":"localhost/deptrace-test/busybox:1","name":"pm1","podId":""}},"scope":"local","time":1795649795,"timeNano":1795649795000000000}
{"Type":"container","Action":"create","Actor":{"ID":"` + dockerID + `","Attributes":{"image":"busybox","name":"d1"}}}
{"Type":"container","Action":"destroy","Actor":{"ID":"` + dockerID + `","Attributes":{"image":"busybox","name":"d1"}}}
`
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(stream)) // the client reads until EOF
	})
	mux.HandleFunc("/containers/json", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("[]")) })
	// Gone before it could be inspected: the event's attributes name it.
	mux.HandleFunc("/containers/", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no such container", http.StatusNotFound) })
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }() // ends with Close below
	defer srv.Close()

	d := newDockerClient(newSource(RuntimePodman, sock, false, nil), time.Minute, 2*time.Second)
	if err := d.follow(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{podmanID, dockerID} {
		c, err := d.lookup(context.Background(), id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if c.gone.IsZero() {
			t.Errorf("container %s (%s) removed in the stream but not marked gone", c.name, id[:12])
		}
	}
	if c, _ := d.lookup(context.Background(), podmanID); c == nil || c.name != "pm1" || c.image != "localhost/deptrace-test/busybox:1" {
		t.Errorf("podman container from its events: %+v", c)
	}
	d.prune(time.Now().Add(2 * time.Minute))
	d.mu.Lock()
	n := len(d.containers)
	d.mu.Unlock()
	if n != 0 {
		t.Errorf("%d containers known after the retain window, want 0", n)
	}
}

// A container removed while the event stream was down (dockerd stopped,
// restarted) sent its destroy event to no one: at the next connection,
// one known before and not running any more is marked gone, and
// forgotten after the retain window, not kept for ever. One still running
// stays.
func TestReconnectMarksContainersGoneMeanwhile(t *testing.T) {
	const (
		goneID = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"
		runsID = "f9e8d7c6b5a40392817f6e5d4c3b2a1f9e8d7c6b5a40392817f6e5d4c3b2a10"
	)
	running := `[{"Id":"` + goneID + `"},{"Id":"` + runsID + `"}]`
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {}) // ends at once: a stream that dropped
	mux.HandleFunc("/containers/json", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(running)) })
	mux.HandleFunc("/containers/{id}/json", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"Id":"` + r.PathValue("id") + `","Name":"/c","Config":{"Image":"busybox"},"State":{"Pid":0}}`))
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }() // ends with Close below
	defer srv.Close()

	d := newDockerClient(newSource(RuntimeDocker, sock, false, nil), time.Minute, 2*time.Second)
	if err := d.follow(context.Background()); err != nil {
		t.Fatal(err)
	}
	running = `[{"Id":"` + runsID + `"}]` // goneID removed while the stream was down
	if err := d.follow(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	gone, runs := d.containers[goneID], d.containers[runsID]
	d.mu.Unlock()
	if gone == nil || gone.gone.IsZero() || runs == nil || !runs.gone.IsZero() {
		t.Fatalf("after the reconnect: removed one %+v, running one %+v; want the first gone, the second not", gone, runs)
	}
	d.prune(time.Now().Add(2 * time.Minute))
	d.mu.Lock()
	_, kept := d.containers[goneID]
	n := len(d.containers)
	d.mu.Unlock()
	if kept || n != 1 {
		t.Errorf("after the retain window: %d containers known, the removed one kept %v; want only the running one", n, kept)
	}
}
