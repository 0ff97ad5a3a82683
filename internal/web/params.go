package web

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/deptrace/deptrace/internal/cli"
	"github.com/deptrace/deptrace/internal/graph"
)

// paramError is a bad query parameter: HTTP 400 with a message that names
// the parameter and what is allowed.
type paramError struct{ msg string }

func (e *paramError) Error() string { return e.msg }

func badParam(format string, a ...any) error { return &paramError{fmt.Sprintf(format, a...)} }

// maxEcho is how much of a value an error repeats: enough to tell which
// it was, without sending a 100 KB target back whole.
const maxEcho = 200

// cut is v as an error repeats it: its first maxEcho bytes (whole
// characters), and how long it was when longer.
func cut(v string) (head, more string) {
	if len(v) <= maxEcho {
		return v, ""
	}
	// A character starts at most 3 bytes back (invalid UTF-8 is cut
	// there).
	n := maxEcho
	for n > maxEcho-utf8.UTFMax+1 && !utf8.RuneStart(v[n]) {
		n--
	}
	return v[:n], fmt.Sprintf("… (%d bytes)", len(v))
}

// quote is a value an error names, as %q would quote it, cut.
func quote(v string) string {
	head, more := cut(v)
	return strconv.Quote(head) + more
}

// clip is a path an error names, cut.
func clip(v string) string {
	head, more := cut(v)
	return head + more
}

// query reads one endpoint's parameters, rejecting any it does not know so
// that a typo never silently widens a query.
type query struct {
	v   url.Values
	now time.Time
}

// newQuery reads the raw query string itself: url.Values from
// URL.Query() drops a pair it cannot read (since=%zz, a=1;b=2), and
// with it a filter or an unknown parameter, which would widen the query.
func newQuery(raw string, now time.Time, allowed ...string) (query, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return query{}, badQuery(raw, err)
	}
	for name, vals := range v {
		if !slices.Contains(allowed, name) {
			return query{}, badParam("unknown parameter %s: allowed %s", quote(name), strings.Join(allowed, ", "))
		}
		if len(vals) > 1 {
			return query{}, badParam("parameter %s given %d times: give it once", name, len(vals))
		}
	}
	return query{v: v, now: now}, nil
}

// badQuery names the first pair of raw that url.ParseQuery could not
// read (its error, err, names neither the pair nor, for a ";", the
// character).
func badQuery(raw string, err error) error {
	for pair := range strings.SplitSeq(raw, "&") {
		if strings.Contains(pair, ";") {
			return badParam("invalid query string: %s holds a \";\": allowed key=value pairs separated by & (a \";\" in a value is %%3B)", quote(pair))
		}
		if _, perr := url.ParseQuery(pair); perr != nil {
			return badParam("invalid query string: %s: %v: allowed key=value pairs separated by &, percent-encoded (a %% in a value is %%25)", quote(pair), perr)
		}
	}
	// Every pair reads alone: too many of them (url.ParseQuery takes
	// 10,000), where an endpoint takes each of its few parameters once.
	return badParam("invalid query string: %v (%d pairs): allowed each parameter once", err, strings.Count(raw, "&")+1)
}

func (q query) str(name string) string { return strings.TrimSpace(q.v.Get(name)) }

func (q query) has(name string) bool { return q.v.Has(name) }

// time reads since/until with the CLI's parser (cli.ParseTime).
func (q query) time(name string) (time.Time, error) {
	v := q.str(name)
	t, err := cli.ParseTime(v, q.now)
	if err != nil {
		return time.Time{}, badParam("invalid %s %s: %v", name, quote(v), err)
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
		// An age counts back from now: since=1h&until=2h is backwards.
		err = badParam("invalid range: since %s is not before until %s: allowed a since before until (an age counts back from now: since=2h&until=1h is the hour from two hours ago to one hour ago)",
			since.Format(time.RFC3339), until.Format(time.RFC3339))
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
		return 0, badParam("invalid depth %s: allowed 0 (unlimited) to 1000", quote(v))
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
	return false, badParam("invalid %s %s: allowed true or false (1/0)", name, quote(v))
}

// Protocols the store knows.
var protos = []string{"tcp", "udp", "unix"}

func (q query) proto() (string, error) {
	v := strings.ToLower(q.str("proto"))
	if v == "" || slices.Contains(protos, v) {
		return v, nil
	}
	return "", badParam("invalid proto %s: allowed %s", quote(q.str("proto")), strings.Join(protos, ", "))
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
	return "", badParam("invalid group_by %s: allowed %s", quote(q.str("group_by")), strings.Join(graph.GroupBys, ", "))
}

// port returns the server port, or -1 when not given.
func (q query) port() (int, error) {
	v := q.str("port")
	if v == "" {
		return -1, nil
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < 0 || p > 65535 {
		return 0, badParam("invalid port %s: allowed 0 to 65535", quote(v))
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
		return 0, badParam("invalid limit %s: allowed 1 to %d", quote(v), most)
	}
	return n, nil
}
