package jsonenc

import (
	"encoding/json"
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
