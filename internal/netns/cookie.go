package netns

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Cookie is the kernel's cookie of the calling thread's network namespace
// (SO_NETNS_COOKIE, Linux 5.14 and later); inside Do, that of the
// namespace Do entered. An inode tells live namespaces apart but not one
// namespace from the next: the kernel gives a freed inode number to the
// next namespace it makes, of any kind, so on a host where containers
// come and go an inode names one container after another within seconds.
// A cookie is never given twice within a boot. Before 5.14 the error
// wraps unix.ENOPROTOOPT.
func Cookie() (uint64, error) {
	// Any socket belongs to the namespace of the thread that made it.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: socket: %w", err)
	}
	defer func() { _ = unix.Close(fd) }() // a socket only asked a question
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: getsockopt SO_NETNS_COOKIE: %w", err)
	}
	return c, nil
}

// CookieOf is the cookie of the live network namespace with inode ino
// (one List finds).
func CookieOf(ino uint32) (uint64, error) {
	list, err := List()
	if err != nil {
		return 0, err
	}
	for _, ns := range list {
		if ns.Inode == ino {
			var c uint64
			err := Do(ns.Path, func() (err error) { c, err = Cookie(); return err })
			return c, err
		}
	}
	return 0, fmt.Errorf("netns cookie: no network namespace with inode %d is reachable", ino)
}
