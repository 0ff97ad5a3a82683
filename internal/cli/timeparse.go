package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// TimeForms names what ParseTime accepts, for error messages.
const TimeForms = `allowed RFC 3339, "2006-01-02 15:04[:05]", "2006-01-02T15:04[:05]", "2006-01-02", "15:04[:05]" (today), now, or an age such as 15m, 1h or 2d`

// MinTime and MaxTime bound the times ParseTime gives. The store keeps
// times as nanoseconds since 1970 in 64 bits, which hold 1677-09-21 to
// 2262-04-11: a time beyond wrapped around (a since in 2999 selected all
// history). The bounds are whole years inside that, leaving the store
// room to round a range's ends to its minutes, hours and days.
var (
	MinTime = time.Date(1678, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTime = time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ParseTime reads a point in time the way every deptrace command and the
// web API take it (--since, --until, ?since=): RFC 3339, "2006-01-02
// 15:04[:05]", "2006-01-02T15:04[:05]", "2006-01-02", "15:04[:05]" (today), "now",
// or an age meaning that long before now (1h, 90m, 2d; a leading "-" is
// allowed: "-1h" is also an hour ago). Local time where no zone is given.
// "" gives the zero time (no bound); a time before MinTime or after
// MaxTime is refused. The error says what is allowed; the caller names
// the flag or parameter.
func ParseTime(v string, now time.Time) (time.Time, error) {
	t, err := parseTime(v, now)
	if err == nil && strings.TrimSpace(v) != "" && (t.Before(MinTime) || t.After(MaxTime)) {
		return time.Time{}, fmt.Errorf("out of range: allowed a time from %s to %s (the store's nanoseconds since 1970 in 64 bits)",
			MinTime.Format(time.RFC3339), MaxTime.Format(time.RFC3339))
	}
	return t, err
}

func parseTime(v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	switch v {
	case "":
		return time.Time{}, nil
	case "now":
		return now, nil
	}
	if d, err := ParseAge(strings.TrimPrefix(v, "-")); err == nil {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, v, time.Local); err == nil {
			return t, nil
		}
	}
	for _, layout := range []string{"15:04:05", "15:04"} { // today
		if t, err := time.ParseInLocation(layout, v, time.Local); err == nil {
			y, m, d := now.In(time.Local).Date()
			return time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), 0, time.Local), nil
		}
	}
	return time.Time{}, errors.New(TimeForms)
}

// maxAgeDays bounds a "d" age so that it fits a time.Duration (about 292
// years) with room to spare.
const maxAgeDays = 100000

// ParseAge reads a non-negative duration: a Go duration (90s, 15m, 1h30m)
// or a number of days with a "d" suffix (2d, 0.5d).
func ParseAge(v string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(v, "d"); ok {
		days, err := strconv.ParseFloat(n, 64)
		if err != nil || days < 0 || days > maxAgeDays {
			return 0, fmt.Errorf("invalid age %q: allowed a number of days from 0 to %d, e.g. 2d", v, maxAgeDays)
		}
		return time.Duration(days * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("invalid age %q: allowed a duration such as 90s, 15m, 1h or 2d", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("invalid age %q: an age cannot be negative", v)
	}
	return d, nil
}

// WindowNames are how a caller names diff's four ends in its errors: the
// CLI's flags (--since) or the API's parameters (since).
type WindowNames struct{ Since, Until, BeforeSince, BeforeUntil string }

// BeforeWindow is the window diff compares [since, until) with (until
// not zero), given the ends asked for, each zero when not given: neither
// is the window of the same length just before since; only beforeSince
// ends at since (the current window's start); only beforeUntil is as long
// as the current window. A start that would fall before MinTime is
// MinTime. A window that does not start before it ends is an error, in
// names, that says which ends were defaulted and from what, and, when
// the defaulted start was held at MinTime (the one way a defaulted start
// reaches its end), what to give instead: the CLI's diff and /api/diff
// print the same sentence.
func BeforeWindow(since, until, beforeSince, beforeUntil time.Time, names WindowNames) (bs, bu time.Time, err error) {
	bs, bu = beforeSince, beforeUntil
	if bu.IsZero() {
		bu = since
	}
	if bs.IsZero() {
		// Sub saturates at about 292 years; MinTime bounds the rest.
		bs = bu.Add(-until.Sub(since))
		if bs.Before(MinTime) {
			bs = MinTime
		}
	}
	if bs.Before(bu) {
		return bs, bu, nil
	}
	first := MinTime.Format(time.RFC3339)
	// How a missing start is defaulted, in the caller's names.
	startDefault := fmt.Sprintf("%s minus the length of [%s, %s), no earlier than %s", names.BeforeUntil, names.Since, names.Until, first)
	clamped := beforeSince.IsZero() && bs.Equal(MinTime)
	dflt, allowed := "", "a window that starts before it ends"
	switch {
	case beforeSince.IsZero() && beforeUntil.IsZero():
		dflt = fmt.Sprintf(" (neither was given: %s defaults to %s, %s to %s)", names.BeforeUntil, names.Since, names.BeforeSince, startDefault)
		if clamped {
			allowed = fmt.Sprintf("a %s after %s, or %s and %s", names.Since, first, names.BeforeSince, names.BeforeUntil)
		}
	case beforeSince.IsZero():
		dflt = fmt.Sprintf(" (%s defaults to %s)", names.BeforeSince, startDefault)
		if clamped {
			allowed = fmt.Sprintf("a %s after %s", names.BeforeUntil, first)
		}
	case beforeUntil.IsZero():
		dflt = fmt.Sprintf(" (%s defaults to %s)", names.BeforeUntil, names.Since)
	}
	return bs, bu, fmt.Errorf("invalid range: %s %s is not before %s %s%s: allowed %s",
		names.BeforeSince, bs.Format(time.RFC3339), names.BeforeUntil, bu.Format(time.RFC3339), dflt, allowed)
}
