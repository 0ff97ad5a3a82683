package jsonenc

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Every kind of character encoding/json escapes, alone and in the middle
// of plain text, comes out as encoding/json writes it.
func TestAppendStringAsEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "nginx", "10.0.0.1", "/run/app.sock", "@abstract", `q"uote`, `back\slash`, "<", ">", "&",
		"tab\t", "nl\n", "\x00\x01\x1f\x7f", "\b\f", "héllo", "\u2028\u2029", "\xff\xfe bad utf8", "日本"} {
		for _, in := range []string{s, "a" + s + "z"} {
			want, _ := json.Marshal(in)
			if got := AppendString([]byte("x"), in); string(got) != "x"+string(want) {
				t.Errorf("AppendString(%q) = %s, want %s", in, got[1:], want)
			}
		}
	}
}

// Times in other zones, with and without fractions, and the zero time come
// out as time.Time's MarshalJSON writes them; a time it refuses (year,
// zone) is refused with its error.
func TestAppendTimeAsEncodingJSON(t *testing.T) {
	for _, tm := range []time.Time{{}, time.Unix(1e9, 0).UTC(), time.Unix(1e9, 120).In(time.FixedZone("", 5*3600+30*60)),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("X", -8*3600))} {
		want, _ := json.Marshal(tm)
		got, err := AppendTime(nil, tm)
		if err != nil || string(got) != string(want) {
			t.Errorf("AppendTime(%v) = %s, %v; want %s", tm, got, err, want)
		}
	}
	for _, tm := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(1e9, 0).In(time.FixedZone("", 24*3600)), time.Unix(1e9, 0).In(time.FixedZone("", -25*3600))} {
		_, want := tm.MarshalJSON()
		got, err := AppendTime([]byte("x"), tm)
		if want == nil || err == nil || err.Error() != want.Error() || string(got) != "x" {
			t.Errorf("%v: %q, %v; want MarshalJSON's error (%v) and nothing appended", tm, got, err, want)
		}
	}
	// Just inside the zone limits: written.
	for _, off := range []int{24*3600 - 60, -24*3600 + 60} {
		tm := time.Unix(1e9, 0).In(time.FixedZone("", off))
		want, _ := json.Marshal(tm)
		if got, err := AppendTime(nil, tm); err != nil || string(got) != string(want) {
			t.Errorf("zone %+d s: %s, %v; want %s", off, got, err, want)
		}
	}
}

// Times writes what AppendTime writes, whichever seconds, zones and
// fractions come one after another (the cached text of a second must not
// leak into another second, or into another zone's same second), and
// refuses what it refuses.
func TestTimesAsAppendTime(t *testing.T) {
	zones := []*time.Location{time.UTC, time.Local, time.FixedZone("", 5*3600+30*60), time.FixedZone("GMT", 0),
		time.FixedZone("X", -8*3600), time.FixedZone("", 24*3600-60)}
	rng := rand.New(rand.NewPCG(3, 4))
	var c Times
	base := time.Date(2026, 11, 27, 19, 59, 58, 0, time.UTC).Unix()
	for i := range 20000 {
		// Seconds that share a slot (8 apart) and fractions with trailing
		// zeros, whole seconds and one nanosecond among them.
		sec := base + rng.Int64N(40)
		ns := [...]int64{0, 1, 100000000, 120, 999999999, rng.Int64N(1e9)}[rng.IntN(6)]
		tm := time.Unix(sec, ns).In(zones[rng.IntN(len(zones))])
		want, werr := AppendTime([]byte("x"), tm)
		got, err := c.Append([]byte("x"), tm)
		if string(got) != string(want) || (err == nil) != (werr == nil) {
			t.Fatalf("time %d (%v): %q, %v; want %q, %v", i, tm, got, err, want, werr)
		}
	}
	for _, tm := range []time.Time{{}, time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("X", -8*3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(1e9, 0).In(time.FixedZone("", 24*3600)), time.Unix(1e9, 0).In(time.FixedZone("", -25*3600))} {
		for range 2 { // once to fill the cache, once from it
			want, werr := AppendTime([]byte("x"), tm)
			got, err := c.Append([]byte("x"), tm)
			if string(got) != string(want) || fmt.Sprint(err) != fmt.Sprint(werr) {
				t.Errorf("%v: %q, %v; want %q, %v", tm, got, err, want, werr)
			}
		}
	}
}
