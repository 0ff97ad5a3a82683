package bundler

import (
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
)

// The table harvest (kernels whose socket-storage iterator is unsafe)
// reports what the storage harvest does: a live TCP connection's bytes
// while it is open, a connected UDP socket's datagrams, and listeners.
func TestTableHarvestReportsLiveSockets(t *testing.T) {
	testnet.RequireRoot(t)
	testHooks.tableHarvest = true
	defer func() { testHooks.tableHarvest = false }()
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]

	bu, err := Load(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer bu.Close()
	for _, h := range bu.Hooks() {
		switch h.Program {
		case "harvest":
			if h.Active {
				t.Fatalf("storage harvest active although forced off")
			}
		case "harvest_tcp", "harvest_udp":
			if !h.Active {
				t.Fatalf("%s inactive: %s\n%s", h.Program, h.Reason, h.Log)
			}
		}
	}
	if _, err := bu.Seed(); err != nil {
		t.Fatal(err)
	}

	ln := b.Listen(t, "tcp4", b.IPv4.String()+":7200")
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 100)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			_, _ = c.Write(buf[:n]) // the echo peer: a lost reply fails the client
		}
	}()
	pc := b.ListenPacket(t, "udp4", b.IPv4.String()+":7201")
	go func() {
		buf := make([]byte, 100)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()

	c, err := a.Dial("tcp4", b.IPv4.String()+":7200")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := a.Dial("udp4", b.IPv4.String()+":7201")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	const rounds, size = 30, 10 // well past the 16 segments that get a connection tagged
	buf := make([]byte, size)
	for i := 0; i < rounds; i++ {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := u.Write(buf); err != nil {
			t.Fatal(err)
		}
	}

	// Sum drains until the open connection's bytes and the datagrams are
	// all reported (both sockets still open: only the harvest reports them).
	var tcpSent, udpSent uint64
	sawListener := false
	deadline := time.Now().Add(20 * time.Second)
	for (tcpSent < rounds*size || udpSent < rounds*size || !sawListener) && time.Now().Before(deadline) {
		entries, listeners, err := bu.Drain()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.NetNS == a.Inode && e.Direction == DirOutbound && e.Port == 7200 {
				tcpSent += e.BytesSent
			}
			if e.NetNS == a.Inode && e.Direction == DirOutbound && e.Port == 7201 {
				udpSent += e.BytesSent
			}
		}
		for _, l := range listeners {
			if l.NetNS == b.Inode && l.Port == 7200 {
				sawListener = true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if tcpSent != rounds*size || udpSent != rounds*size || !sawListener {
		t.Fatalf("table harvest: tcp sent %d, udp sent %d (want %d each), listener seen %v", tcpSent, udpSent, rounds*size, sawListener)
	}
}
