package web

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/graph"
)

// paramError is a bad query parameter: HTTP 400 with a message that names
// the parameter and what is allowed.
type paramError struct{ msg string }

func (e *paramError) Error() string { return e.msg }

func badParam(format string, a ...any) error { return &paramError{fmt.Sprintf(format, a...)} }

// query reads one endpoint's parameters, rejecting any it does not know so
// that a typo never silently widens a query.
type query struct {
	v   url.Values
	now time.Time
}

func newQuery(v url.Values, now time.Time, allowed ...string) (query, error) {
	for name, vals := range v {
		if !slices.Contains(allowed, name) {
			return query{}, badParam("unknown parameter %q: allowed %s", name, strings.Join(allowed, ", "))
		}
		if len(vals) > 1 {
			return query{}, badParam("parameter %s given %d times: give it once", name, len(vals))
		}
	}
	return query{v: v, now: now}, nil
}

func (q query) str(name string) string { return strings.TrimSpace(q.v.Get(name)) }

func (q query) has(name string) bool { return q.v.Has(name) }

// time reads since/until with the CLI's parser (cli.ParseTime).
func (q query) time(name string) (time.Time, error) {
	v := q.str(name)
	t, err := cli.ParseTime(v, q.now)
	if err != nil {
		return time.Time{}, badParam("invalid %s %q: %v", name, v, err)
	}
	return t, nil
}

// window reads since and until and checks that they form a range.
func (q query) window() (since, until time.Time, err error) {
	if since, err = q.time("since"); err != nil {
		return
	}
	if until, err = q.time("until"); err != nil {
		return
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		err = badParam("invalid range: since %s is not before until %s", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	return
}

// depth reads a non-negative level count (0: unlimited).
func (q query) depth(def int) (int, error) {
	v := q.str("depth")
	if v == "" {
		return def, nil
	}
	d, err := strconv.Atoi(v)
	if err != nil || d < 0 || d > 1000 {
		return 0, badParam("invalid depth %q: allowed 0 (unlimited) to 1000", v)
	}
	return d, nil
}

func (q query) bool(name string) (bool, error) {
	v := q.str(name)
	switch strings.ToLower(v) {
	case "":
		// "?reverse" alone means true.
		return q.has(name), nil
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, badParam("invalid %s %q: allowed true or false (1/0)", name, v)
}

// Protocols the store knows.
var protos = []string{"tcp", "udp", "unix"}

func (q query) proto() (string, error) {
	v := strings.ToLower(q.str("proto"))
	if v == "" || slices.Contains(protos, v) {
		return v, nil
	}
	return "", badParam("invalid proto %q: allowed %s", q.str("proto"), strings.Join(protos, ", "))
}

// groupBy reads group_by: what a node is (default a workload).
func (q query) groupBy() (string, error) {
	v := strings.ToLower(q.str("group_by"))
	if v == "" {
		return graph.ByWorkload, nil
	}
	if slices.Contains(graph.GroupBys, v) {
		return v, nil
	}
	return "", badParam("invalid group_by %q: allowed %s", q.str("group_by"), strings.Join(graph.GroupBys, ", "))
}

// port returns the server port, or -1 when not given.
func (q query) port() (int, error) {
	v := q.str("port")
	if v == "" {
		return -1, nil
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 0 || p > 65535 {
		return 0, badParam("invalid port %q: allowed 0 to 65535", v)
	}
	return p, nil
}

// limit reads limit: how many items an answer holds at most (1 to max,
// def when not given).
func (q query) limit(def, most int) (int, error) {
	v := q.str("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, badParam("invalid limit %q: allowed 1 to %d", v, most)
	}
	return n, nil
}
