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
	if err := refused(t, offset); err != nil {
		return b, err
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

// refused is time.Time's MarshalJSON error for t, whose zone is offset
// seconds east of UTC, when it refuses t (a year outside 0-9999, a zone
// 24 hours or more from UTC); nil otherwise. Only those times are handed
// to MarshalJSON, which allocates.
func refused(t time.Time, offset int) error {
	if y := t.Year(); y < 0 || y > 9999 || offset <= -24*3600 || offset >= 24*3600 {
		_, err := t.MarshalJSON()
		return err
	}
	return nil
}

// Times appends times as AppendTime does, keeping the date and clock text
// of the last seconds it wrote: an interval's flows have their times in a
// few seconds, and formatting each whole time was a twentieth of a jsonl
// consumer's CPU with 1,000 client hosts. The zero value is ready.
type Times struct {
	seconds [8]secondText // by unix second, modulo 8
}

// secondText is the text of one second in one zone offset.
type secondText struct {
	unix   int64
	offset int    // seconds east of UTC
	clock  []byte // "2006-01-02T15:04:05"
	zone   []byte // "Z" or "-07:00"
}

// Append appends t as AppendTime does, with its error for a time
// encoding/json refuses.
func (c *Times) Append(b []byte, t time.Time) ([]byte, error) {
	_, offset := t.Zone()
	unix := t.Unix()
	s := &c.seconds[uint64(unix)%uint64(len(c.seconds))]
	if s.clock == nil || s.unix != unix || s.offset != offset {
		if err := refused(t, offset); err != nil {
			return b, err
		}
		s.unix, s.offset = unix, offset
		s.clock = t.AppendFormat(s.clock[:0], "2006-01-02T15:04:05")
		s.zone = t.AppendFormat(s.zone[:0], "Z07:00")
	}
	b = append(b, '"')
	b = append(b, s.clock...)
	if ns := t.Nanosecond(); ns != 0 {
		// RFC 3339's fraction as time.RFC3339Nano writes it: up to nine
		// digits, trailing zeros dropped.
		var d [10]byte
		d[0] = '.'
		for i := 9; i > 0; i-- {
			d[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := len(d)
		for d[n-1] == '0' {
			n--
		}
		b = append(b, d[:n]...)
	}
	b = append(b, s.zone...)
	return append(b, '"'), nil
}
