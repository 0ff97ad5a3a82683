package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// dockerClient speaks Docker's Engine API (also served by podman's
// Docker-compatible socket) over its unix socket: container inspection and
// the event stream, which is all naming needs. Plain net/http: the
// official client module's dependency tree is far larger than these two
// endpoints.
type dockerClient struct {
	runtime string // RuntimeDocker or RuntimePodman
	src     *source
	http    *http.Client
	retain  time.Duration
	timeout time.Duration
	// onStart is told the main process of each container that starts, so
	// its cgroup is learnt while it exists.
	onStart func(pid int)

	mu         sync.Mutex
	containers map[string]*container // full id -> what the runtime said
}

type container struct {
	id, name, image string
	labels          map[string]string
	gone            time.Time // destroyed at; zero while it exists
}

func newDockerClient(src *source, retain, timeout time.Duration) *dockerClient {
	socket := src.socket
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if err := checkSocket(socket); err != nil {
				return nil, err
			}
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns: 2,
	}
	return &dockerClient{runtime: src.runtime, src: src, http: &http.Client{Transport: tr},
		retain: retain, timeout: timeout, containers: map[string]*container{}}
}

func (d *dockerClient) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.runtime+path, nil)
	if err != nil {
		return err
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read side of a response
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &apiError{status: resp.StatusCode, msg: strings.TrimSpace(string(b))}
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("status %d: %s", e.status, e.msg) }

type inspectResponse struct {
	ID     string `json:"Id"`
	Name   string `json:"Name"`
	Config struct {
		Image  string            `json:"Image"`
		Labels map[string]string `json:"Labels"`
	} `json:"Config"`
	State struct {
		Pid int `json:"Pid"`
	} `json:"State"`
}

// inspect asks the runtime about one container and caches the answer.
func (d *dockerClient) inspect(ctx context.Context, id string) (*container, int, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	var r inspectResponse
	if err := d.get(ctx, "/containers/"+url.PathEscape(id)+"/json", &r); err != nil {
		return nil, 0, fmt.Errorf("%s inspect %s: %w", d.runtime, id, err)
	}
	c := &container{id: r.ID, name: strings.TrimPrefix(r.Name, "/"), image: r.Config.Image, labels: r.Config.Labels}
	d.mu.Lock()
	d.containers[c.id] = c
	d.mu.Unlock()
	return c, r.State.Pid, nil
}

// lookup returns what is known of a container: learnt from its events, or
// asked now. A container destroyed within retain is still known. A
// runtime that does not answer while its event stream is down is told
// to the source: a container of its needed naming.
func (d *dockerClient) lookup(ctx context.Context, id string) (*container, error) {
	d.mu.Lock()
	c, ok := d.containers[id]
	d.mu.Unlock()
	if ok {
		return c, nil
	}
	c, _, err := d.inspect(ctx, id)
	var api *apiError
	switch {
	case err == nil || errors.As(err, &api) && api.status < 500: // it answered
		d.src.lookupOK()
	case timedOut(err):
		// A runtime that hangs (a stopped dockerd) keeps its event
		// stream open, silent: only its lookups say it is not
		// answering. One container's inspect can hang alone (dockerd
		// holds a container's lock while it stops it): a runtime that
		// answers /version is not hung.
		var vapi *apiError
		if _, verr := d.version(ctx); verr != nil && !errors.As(verr, &vapi) {
			d.src.failedLookup(err)
		}
	default: // a 5xx (a proxy in front of a dead runtime), a refused connect
		d.src.failedWhileDown(err)
	}
	return c, err
}

// timedOut reports whether err is a request that got no answer in time.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// version asks the Engine API what it is.
func (d *dockerClient) version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	var v struct {
		Version    string `json:"Version"`
		APIVersion string `json:"ApiVersion"`
	}
	if err := d.get(ctx, "/version", &v); err != nil {
		return "", withoutURL(err)
	}
	return "version " + v.Version + ", API " + v.APIVersion, nil
}

type dockerEvent struct {
	Type   string `json:"Type"`
	Action string `json:"Action"`
	Actor  struct {
		ID         string            `json:"ID"`
		Attributes map[string]string `json:"Attributes"`
	} `json:"Actor"`
}

// run follows the event stream until ctx ends, reconnecting (every few
// seconds while the runtime is down). Containers already running are
// listed at each connection. Whether the stream connects is what its
// source reports.
func (d *dockerClient) run(ctx context.Context) {
	backoff := streamRetry[0]
	for ctx.Err() == nil {
		err := d.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = streamRetry[0]
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, streamRetry[1])
	}
}

// streamRetry is the first and the longest wait before reconnecting to an
// event stream.
var streamRetry = [2]time.Duration{time.Second, 10 * time.Second}

func (d *dockerClient) follow(ctx context.Context) error {
	filters := url.QueryEscape(`{"type":["container"]}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.runtime+"/events?filters="+filters, nil)
	if err != nil {
		return err
	}
	resp, err := d.http.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			d.src.failed(err, false)
		}
		return err
	}
	defer func() { _ = resp.Body.Close() }() // read side of a response
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		err := fmt.Errorf("%s events: %w", d.runtime, &apiError{status: resp.StatusCode, msg: strings.TrimSpace(string(b))})
		d.src.failed(err, false)
		return err
	}
	d.src.ok()
	defer d.src.down()
	// Events from now on are in the stream; list what runs already.
	var list []struct {
		ID string `json:"Id"`
	}
	d.mu.Lock()
	known := make([]string, 0, len(d.containers))
	for id, c := range d.containers {
		if c.gone.IsZero() {
			known = append(known, id)
		}
	}
	d.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, d.timeout)
	if err := d.get(lctx, "/containers/json", &list); err == nil {
		running := make(map[string]bool, len(list))
		for _, c := range list {
			running[c.ID] = true
			d.learn(ctx, c.ID, nil)
		}
		// A container known before and not running now stopped or went
		// while the stream was down, its events sent to no one: it is
		// gone from now, kept for the retain window as a destroyed one
		// (and learnt again if it starts). Without this, a runtime's
		// outage kept every container removed meanwhile for ever.
		now := time.Now()
		d.mu.Lock()
		for _, id := range known {
			if c, ok := d.containers[id]; ok && c.gone.IsZero() && !running[id] {
				c.gone = now
			}
		}
		d.mu.Unlock()
	}
	cancel()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev dockerEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		d.src.ok() // it talks: an outage a lookup found is over
		if ev.Type != "" && ev.Type != "container" {
			continue
		}
		switch ev.Action {
		case "create", "start":
			d.learn(ctx, ev.Actor.ID, ev.Actor.Attributes)
		case "destroy", "remove":
			// Docker says "destroy"; podman's Docker-compatible stream
			// says "remove" (podman 4.3, and Docker's "destroy" never).
			d.mu.Lock()
			if c, ok := d.containers[ev.Actor.ID]; ok && c.gone.IsZero() {
				c.gone = time.Now()
			}
			d.mu.Unlock()
		}
	}
}

// learn records a container that was created or started: its metadata and,
// while its main process runs, its cgroup. The event's attributes (name,
// image and every label) stand in if it is already gone.
func (d *dockerClient) learn(ctx context.Context, id string, attrs map[string]string) {
	_, pid, err := d.inspect(ctx, id)
	if err == nil {
		d.src.lookupOK()
		if pid > 0 && d.onStart != nil {
			d.onStart(pid)
		}
		return
	}
	if attrs == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.containers[id]; ok {
		return
	}
	c := &container{id: id, name: attrs["name"], image: attrs["image"], labels: map[string]string{}}
	for k, v := range attrs {
		if k != "name" && k != "image" {
			c.labels[k] = v
		}
	}
	d.containers[id] = c
}

// prune forgets containers destroyed more than retain ago.
func (d *dockerClient) prune(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, c := range d.containers {
		if !c.gone.IsZero() && now.Sub(c.gone) > d.retain {
			delete(d.containers, id)
		}
	}
}

// composeWorkload is "compose/<project>/<service>" from Docker Compose's
// labels, "" for a container Compose did not make.
func composeWorkload(labels map[string]string) string {
	p, s := labels["com.docker.compose.project"], labels["com.docker.compose.service"]
	if p == "" || s == "" {
		return ""
	}
	return "compose/" + p + "/" + s
}
