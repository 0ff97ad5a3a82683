package tracer_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/tracer"
)

func pinPath(t *testing.T) string {
	p := filepath.Join(filepath.Dir(tracer.DefaultPinPath), fmt.Sprintf("deptrace-test-%d", os.Getpid()))
	t.Cleanup(func() { tracer.Cleanup(p) })
	return p
}

func newPinned(t *testing.T, path string) *tracer.Tracer {
	t.Helper()
	cfg := tracer.DefaultConfig()
	cfg.PinPath = path
	tr, err := tracer.New(cfg)
	if err != nil {
		t.Fatalf("load pinned tracer: %v", err)
	}
	return tr
}

// A process that dies leaves the kernel side counting; the next one adopts
// it and reports everything: what the first never drained, and what
// happened while no process ran. Nothing is lost or counted twice.
func TestPinnedKernelSideSurvivesItsProcess(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	path := pinPath(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":6060")
	wait := echoServer(ln, 60, 4, 4)
	server := b.IPv4.String() + ":6060"

	first := newPinned(t, path)
	if first.Adoption().Adopted {
		t.Fatal("a fresh pin path reported an adoption")
	}
	if _, err := newPinnedErr(path); err == nil || !strings.Contains(err.Error(), "owns the kernel side") {
		t.Fatalf("second tracer on one pin path: %v; want a refusal", err)
	}
	l := newLedger()
	connectN(t, a, "tcp4", server, 30, 4, 4)
	l.add(collect(t, first)) // some drained...
	connectN(t, a, "tcp4", server, 10, 4, 4)
	first.Release() // ...some not: the process "dies" here
	connectN(t, a, "tcp4", server, 10, 4, 4) // no process runs

	second := newPinned(t, path)
	defer second.Close()
	if ad := second.Adoption(); !ad.Adopted || ad.Replaced != "" {
		t.Fatalf("adoption: %+v", ad)
	}
	connectN(t, a, "tcp4", server, 10, 4, 4)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	settle(t, second, l, func(l *ledger) bool { return l.one(t, a).BytesReceived >= 60*4 && l.one(t, b).BytesReceived >= 60*4 })
	for _, h := range []*testnet.Host{a, b} {
		if f := l.one(t, h); f.Connections != 60 || f.BytesSent != 60*4 || f.BytesReceived != 60*4 {
			t.Errorf("%s: %+v; want 60 connections and 240 bytes each way", h.Name, f.Counters)
		}
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("pins left after Close: %v", err)
	}
}

func newPinnedErr(path string) (*tracer.Tracer, error) {
	cfg := tracer.DefaultConfig()
	cfg.PinPath = path
	return tracer.New(cfg)
}

// A kernel side pinned with other map sizes is not adopted: it is
// replaced, and what it counted is still reported.
func TestIncompatiblePinnedSideIsReplaced(t *testing.T) {
	nw := testnet.New(t, 2)
	a, b := nw.Hosts[0], nw.Hosts[1]
	path := pinPath(t)
	ln := b.Listen(t, "tcp4", b.IPv4.String()+":6061")
	wait := echoServer(ln, 5, 3, 3)

	cfg := tracer.DefaultConfig()
	cfg.PinPath = path
	cfg.FlowMapSize = 4096
	old, err := tracer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	connectN(t, a, "tcp4", b.IPv4.String()+":6061", 5, 3, 3)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	old.Release()

	tr := newPinned(t, path) // default map size: another layout
	defer tr.Close()
	ad := tr.Adoption()
	if ad.Adopted || !strings.Contains(ad.Replaced, "flow-map-size") || ad.Salvaged == 0 {
		t.Fatalf("adoption: %+v; want the old side replaced and its flows salvaged", ad)
	}
	l := newLedger()
	settle(t, tr, l, func(l *ledger) bool { return l.one(t, a).Connections >= 5 })
	if f := l.one(t, a); f.Connections != 5 {
		t.Errorf("salvaged client flow: %+v", f.Counters)
	}
}
