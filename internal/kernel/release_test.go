package kernel

import "testing"

func TestParseRelease(t *testing.T) {
	for _, c := range []struct {
		in         string
		maj, minor int
		ok         bool
	}{
		{"7.3.4+deb13-cloud-amd64", 7, 3, true},
		{"6.1.0-56-cloud-amd64", 6, 1, true},
		{"6.19-rc1", 6, 19, true},
		{"6.18.0", 6, 18, true},
		{"garbage", 0, 0, false},
	} {
		maj, minor, ok := ParseRelease(c.in)
		if maj != c.maj || minor != c.minor || ok != c.ok {
			t.Errorf("ParseRelease(%q) = %d, %d, %t; want %d, %d, %t", c.in, maj, minor, ok, c.maj, c.minor, c.ok)
		}
	}
}
