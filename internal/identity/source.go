package identity

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"time"
)

// source is one runtime API the resolver asks (Docker's or podman's
// socket, a CRI socket) and what the operator has been told of it: one
// warning when it stops answering while its containers need names, once
// per outage, and one line when it answers again. Its lookups are
// retried all the same (the event stream every 1-10 s, an unnamed
// container every retryAfter), so names come back by themselves.
type source struct {
	runtime, socket string
	// asked: the socket is not the runtime's default, so it was set.
	asked bool
	// present: containers of this runtime were in the cgroup tree at
	// start; the first failure counts as one a container needed.
	present bool
	log     *slog.Logger

	mu       sync.Mutex
	up       bool      // its last request was answered
	answered bool      // it has answered since the start
	said     saidLevel // what this outage has logged
	downAt   time.Time // when this outage began
	// byLookup: this outage was found by a lookup that got no answer
	// while the event stream stayed open (a hung runtime), so an answer
	// to a lookup ends it; one the stream found ends when it reconnects.
	byLookup bool
}

type saidLevel int

const (
	saidNothing saidLevel = iota
	saidInfo              // an asked-for socket is not there
	saidWarn              // names are being lost
)

// The log lines, greppable and quoted in docs/flows.md.
const (
	msgUnreachable = "container runtime unreachable: containers not named yet are named by id only until it answers; containers already named keep their names"
	msgNotThere    = "container runtime socket not there: its containers will be named once it answers"
	msgAnswers     = "container runtime answers: its containers are named"
	msgAnswerAgain = "container runtime answers again: containers are named again"
)

func newSource(runtime, socket string, asked bool, log *slog.Logger) *source {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &source{runtime: runtime, socket: socket, asked: asked, log: log}
}

// failed records a request that got no answer. needed says a container
// of this runtime wanted naming just now. A socket that is simply not
// there is the normal state of a host without that runtime: it warns
// only once the runtime answered before, or its containers need it, and
// is told at info level when the socket was asked for. Anything else (a
// socket that refuses, a file that is no socket, a timeout) warns.
func (s *source) failed(err error, needed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedLocked(err, needed)
}

func (s *source) failedLocked(err error, needed bool) {
	if s.up || s.downAt.IsZero() {
		s.downAt = time.Now()
	}
	s.up = false
	needed = needed || s.present
	s.present = false
	if s.said == saidWarn {
		return
	}
	switch {
	case s.answered || needed || !noSocket(err):
		s.said = saidWarn
		s.log.Warn(msgUnreachable, "runtime", s.runtime, "socket", s.socket, "err", errText(err))
	case s.asked && s.said == saidNothing:
		s.said = saidInfo
		s.log.Info(msgNotThere, "runtime", s.runtime, "socket", s.socket, "err", errText(err))
	}
}

// failedWhileDown is failed for a lookup's failure, which says nothing
// new while the source is up (the event stream is the judge of that).
func (s *source) failedWhileDown(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.up { // under the lock: an ok() in between must not be undone
		s.failedLocked(err, true)
	}
}

// down records that an event stream ended: the next connect says whether
// the runtime is gone.
func (s *source) down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.up {
		s.up, s.downAt = false, time.Now()
	}
}

// failedLookup is failed for a lookup that got no answer in time while
// the runtime's event stream may still be open: a hung runtime.
func (s *source) failedLookup(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.said != saidWarn {
		s.byLookup = true
	}
	s.failedLocked(err, true)
}

// lookupOK records a lookup's answer: it ends an outage a lookup found,
// not one the event stream found (a stream refused while lookups answer
// would say both, over and over).
func (s *source) lookupOK() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.said == saidNothing || s.byLookup {
		s.okLocked()
	}
}

// ok records an answer; after a line about its absence, it says so.
func (s *source) ok() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.okLocked()
}

func (s *source) okLocked() {
	if s.said != saidNothing {
		msg := msgAnswers
		if s.answered {
			msg = msgAnswerAgain
		}
		s.log.Info(msg, "runtime", s.runtime, "socket", s.socket, "down", time.Since(s.downAt).Round(100*time.Millisecond))
	}
	s.up, s.answered, s.said, s.downAt, s.byLookup = true, true, saidNothing, time.Time{}, false
}

// notSocketError is a runtime's socket path that holds something else.
type notSocketError struct {
	path string
	mode fs.FileMode
}

func (e *notSocketError) Error() string {
	what := "a regular file"
	switch {
	case e.mode.IsDir():
		what = "a directory"
	case e.mode&fs.ModeType != 0:
		what = "a " + e.mode.Type().String() + " file"
	}
	return fmt.Sprintf("%s is not a socket (%s)", e.path, what)
}

// checkSocket stats a runtime's socket before any connect(): deptrace's
// own refused connect to a runtime the host does not run would show in
// every trace as a failing dependency, and a connect to a file that is no
// socket tells less than this error.
func checkSocket(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode()&fs.ModeSocket == 0 {
		return &notSocketError{path: path, mode: st.Mode()}
	}
	return nil
}

// noSocket says that an error is a socket that is not there: nothing at
// the path, or a directory (what a bind mount of a missing socket leaves,
// as Docker's -v does).
func noSocket(err error) bool {
	var ns *notSocketError
	return errors.Is(err, fs.ErrNotExist) || errors.As(err, &ns) && ns.mode.IsDir()
}

// errText is an error without net/http's `Get "http://docker/...":`.
func errText(err error) string { return withoutURL(err).Error() }

// withoutURL drops net/http's `Get "http://docker/...":` (the host is
// the runtime's name, not an address): what is left says what failed.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Check is what one request to a runtime's API found.
type Check struct {
	// Err is why it did not answer; nil when it did.
	Err error
	// NoSocket: there is no socket at the path (nothing, or a directory).
	// A file that is no socket is an Err, never connected to.
	NoSocket bool
	// NoCRI: a CRI socket answered but serves no CRI runtime API
	// (containerd with its cri plugin off, as Docker's containerd is).
	NoCRI bool
	// Version is what it said it is: "version 26.1.5, API 1.45" for the
	// Engine API, "containerd v1.7.24, CRI v1" for CRI.
	Version string
}

// CheckSource asks a runtime's API for its version once, as the resolver
// reaches it (no connect to a path that holds no socket), within
// timeout. runtime is RuntimeDocker, RuntimePodman, RuntimeContainerd or
// RuntimeCRIO.
func CheckSource(ctx context.Context, runtime, socket string, timeout time.Duration) Check {
	var c Check
	switch runtime {
	case RuntimeDocker, RuntimePodman:
		d := newDockerClient(newSource(runtime, socket, false, nil), time.Minute, timeout)
		defer d.http.CloseIdleConnections()
		c.Version, c.Err = d.version(ctx)
	case RuntimeContainerd, RuntimeCRIO:
		cc := newCRIClient(newSource(runtime, socket, false, nil), timeout)
		defer cc.close()
		c.Version, c.Err = cc.versionText(ctx)
		c.NoCRI = isUnimplemented(c.Err)
	default:
		c.Err = fmt.Errorf("unknown runtime %q", runtime)
	}
	c.NoSocket = c.Err != nil && noSocket(c.Err)
	return c
}
