// Package jsonenc appends JSON values exactly as encoding/json writes
// them, without reflection, for the writers that run for every flow or
// edge (jsonl output, graph export). Anything unusual is handed to
// encoding/json itself, so the bytes never differ from its own.
package jsonenc

import (
	"encoding/json"
	"time"
	"unicode/utf8"
)

// AppendString appends s quoted. A string with anything encoding/json
// escapes (control characters, quotes, backslashes, HTML's <, > and &,
// non-ASCII that may be invalid UTF-8 or U+2028/U+2029) goes through
// encoding/json; names and addresses are plain ASCII and do not.
func AppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// AppendTime appends t as time.Time's MarshalJSON does, without its
// allocation; a time it refuses (a year outside 0-9999, a zone 24 hours or
// more from UTC) returns its error and b unchanged.
func AppendTime(b []byte, t time.Time) ([]byte, error) {
	_, offset := t.Zone()
	if y := t.Year(); y < 0 || y > 9999 || offset <= -24*3600 || offset >= 24*3600 {
		_, err := t.MarshalJSON()
		return b, err
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}
