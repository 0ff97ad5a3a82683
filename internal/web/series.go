package web

import (
	"net/http"
	"strconv"
	"time"

	"github.com/deptrace/deptrace/internal/graph"
	"github.com/deptrace/deptrace/internal/store"
	"github.com/deptrace/deptrace/tracer"
)

// Series bounds: a series has at most maxPoints points, each a whole
// number of minutes (the store's finest buckets).
const (
	defaultPoints = 30
	maxPoints     = 120
)

// seriesPoint is one step of an edge's history: its counters summed over
// [t, t+step).
type seriesPoint struct {
	T time.Time `json:"t"`
	tracer.Counters
	ConnectLatencyAvgUs uint64 `json:"connect_latency_avg_us"`
	Unhealthy           bool   `json:"unhealthy"`
}

type seriesAnswer struct {
	From   string        `json:"from"`
	To     string        `json:"to"`
	Proto  string        `json:"proto"`
	Port   int           `json:"port"`
	Since  time.Time     `json:"since"`
	Until  time.Time     `json:"until"`
	StepS  int64         `json:"step_seconds"`
	Points []seriesPoint `json:"points"`
}

// handleSeries answers one edge's history over the range: from, to, proto
// and port name the edge as /api/graph gives it (group_by as there);
// points (default 30, at most 120) splits the range into steps of whole
// minutes (one more point when the range starts inside a minute).
// Each step is read from the store like a range of its own, keeping only
// the observations of the edge's protocol and port, so a point costs the
// flows of its minutes, not the whole graph.
func (s *Server) handleSeries(w http.ResponseWriter, r *http.Request) {
	q, err := newQuery(r.URL.Query(), s.now(), "since", "until", "group_by", "from", "to", "proto", "port", "points")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	since, until, err := q.window()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if until.IsZero() {
		until = q.now
	}
	if since.IsZero() {
		since = until.Add(-time.Hour)
	}
	if !since.Before(until) {
		s.fail(w, r, badParam("invalid since %s: allowed a time before until", since.Format(time.RFC3339)))
		return
	}
	by, err := q.groupBy()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	from, to := q.str("from"), q.str("to")
	if from == "" || to == "" {
		s.fail(w, r, badParam("missing from or to: allowed the ids of an edge's ends, as /api/graph gives them"))
		return
	}
	proto, err := q.proto()
	if err != nil || proto == "" {
		s.fail(w, r, badParam("invalid proto %q: allowed %s", q.str("proto"), "tcp, udp, unix"))
		return
	}
	port, err := q.port()
	if err != nil || port < 0 {
		s.fail(w, r, badParam("invalid port %q: allowed 0 to 65535", q.str("port")))
		return
	}
	points := defaultPoints
	if v := q.str("points"); v != "" {
		if points, err = strconv.Atoi(v); err != nil || points < 1 || points > maxPoints {
			s.fail(w, r, badParam("invalid points %q: allowed 1 to %d", v, maxPoints))
			return
		}
	}
	// The step divides the range asked for into points whole minutes;
	// the first step starts on the minute since falls in, so a range that
	// starts inside a minute has one point more.
	span := until.Sub(since)
	step := ((span/time.Duration(points) + time.Minute - 1) / time.Minute) * time.Minute
	start := since.Truncate(time.Minute)
	if step < time.Minute {
		step = time.Minute
	}
	ctx := r.Context()
	hosts, err := s.st.Hosts(ctx)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ids, err := s.st.Identities(ctx, store.Range{Since: start, Until: until})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ans := seriesAnswer{From: from, To: to, Proto: proto, Port: port, Since: start, Until: until, StepS: int64(step / time.Second), Points: []seriesPoint{}}
	for t := start; t.Before(until); t = t.Add(step) {
		end := t.Add(step)
		if end.After(until) {
			end = until
		}
		obs, err := s.st.Observations(ctx, store.Range{Since: t, Until: end})
		if err != nil {
			s.fail(w, r, err)
			return
		}
		var keep []store.Observation // obs may be the cache's: not filtered in place
		for _, o := range obs {
			if o.Proto == proto && int(o.Port) == port {
				keep = append(keep, o)
			}
		}
		g := graph.Build(keep, hosts, nil)
		graph.Name(&g, ids)
		g = graph.Group(g, by)
		g.Judge(s.health)
		p := seriesPoint{T: t}
		for _, e := range g.Edges {
			if e.From == from && e.To == to && e.Proto == proto && int(e.Port) == port {
				p.Counters, p.ConnectLatencyAvgUs, p.Unhealthy = e.Counters, e.ConnectLatencyAvgUs, e.Unhealthy
			}
		}
		ans.Points = append(ans.Points, p)
	}
	s.json(w, ans)
}
