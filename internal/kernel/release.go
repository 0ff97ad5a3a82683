package kernel

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReleaseAtLeast compares the running kernel's release with major.minor;
// a release it cannot read counts as new.
func ReleaseAtLeast(major, minor int) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return true
	}
	maj, mnr, ok := ParseRelease(unix.ByteSliceToString(u.Release[:]))
	return !ok || maj > major || (maj == major && mnr >= minor)
}

// ParseRelease reads "7.3.4+deb13-cloud-amd64" as 7, 3.
func ParseRelease(release string) (major, minor int, ok bool) {
	a, rest, found := strings.Cut(release, ".")
	if !found {
		return 0, 0, false
	}
	b := rest
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		b = rest[:i]
	}
	var err1, err2 error
	major, err1 = strconv.Atoi(a)
	minor, err2 = strconv.Atoi(b)
	return major, minor, err1 == nil && err2 == nil
}
