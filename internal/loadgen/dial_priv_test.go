package loadgen

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
)

// An emulated client host's TCP connections share its source ports across
// servers, as a real host's do: in a namespace with two local ports, one
// source holds three connections to three servers at once. Bound to
// src:0 before connect(), the third finds no port (EADDRINUSE).
func TestSourceAddressSharesPortsAcrossServers(t *testing.T) {
	h := testnet.New(t, 1).Hosts[0]
	h.Do(t, func() error {
		// /proc/sys/net is the opener's namespace: this thread's.
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 40001"), 0o644)
	})
	src := netip.MustParseAddr("127.1.0.1")
	var servers []string
	for port := range 3 { // fixed, outside the range: one on :0 would take one of its two
		ln := h.Listen(t, "tcp", fmt.Sprintf("127.0.0.1:%d", 20001+port))
		servers = append(servers, ln.Addr().String())
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	h.Do(t, func() error {
		for i, s := range servers {
			c, err := dialer("tcp", src).Dial("tcp", s)
			if err != nil {
				return fmt.Errorf("connection %d of %d from %s: %w", i+1, len(servers), src, err)
			}
			conns = append(conns, c)
		}
		return nil
	})
	for _, c := range conns {
		local := c.LocalAddr().(*net.TCPAddr)
		if !local.IP.Equal(src.AsSlice()) || local.Port < 40000 || local.Port > 40001 {
			t.Errorf("connection from %s, want %s and a port of 40000-40001", local, src)
		}
	}
}
