// The harvest: before each drain switches interval, the iterators fold
// live sockets' counter growth into the active flow map and report every
// listener.

package bundler

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"

	"github.com/cilium/ebpf/link"
	"github.com/deptrace/deptrace/internal/netns"
)

// Listener is one listening TCP socket as the harvest saw it.
type Listener struct {
	NetNS        uint32
	Port         uint16
	Local        netip.Addr
	BacklogLimit uint32
	Queue        uint32 // accept queue at the harvest
	QueueMax     uint32 // deepest accept queue seen since the previous harvest (per port)
	Drops        uint64 // since the previous harvest
	PID          uint32
	Comm         string
}

// harvest runs the socket-storage iterator: it folds live sockets' counter
// growth into the active flow map and reports every listener.
func (b *Bundler) harvest() ([]Listener, error) {
	if b.drain.harvestGen == 0 {
		b.drain.harvestGen = rand.Uint32()
	}
	b.drain.harvestGen++
	if err := b.objs.HarvestGen.Set(b.drain.harvestGen); err != nil {
		return nil, fmt.Errorf("set harvest_gen: %w", err)
	}
	var recs []bundlerListenerRecord
	if it, ok := b.iters["harvest"]; ok {
		var err error
		recs, err = readIter[bundlerListenerRecord](it)
		if err != nil {
			return nil, fmt.Errorf("harvest live sockets: %w", err)
		}
	} else if _, ok := b.iters["harvest_tcp"]; ok {
		var err error
		recs, err = b.harvestTables()
		if err != nil {
			return decodeListeners(recs), err
		}
	} else {
		return nil, errors.New("harvest iterator is not attached")
	}
	return decodeListeners(recs), nil
}

func decodeListeners(recs []bundlerListenerRecord) []Listener {
	out := make([]Listener, len(recs))
	for i, r := range recs {
		out[i] = Listener{NetNS: r.Netns, Port: r.Port, Local: netip.AddrFrom16(r.LocalAddr).Unmap(),
			BacklogLimit: r.BacklogLimit, Queue: r.Queue, QueueMax: r.QueueMax, Drops: r.Drops, PID: r.Pid, Comm: commString(r.Comm)}
	}
	return out
}

// harvestTables is the harvest where the socket-storage iterator is unsafe
// (storageIterUnsafe): the TCP and UDP socket iterators, in every watched
// namespace, each a walk of that namespace's socket tables. A namespace
// that no process or bind mount holds any more has no sockets left to
// harvest, and one that vanishes while being entered is skipped.
func (b *Bundler) harvestTables() ([]bundlerListenerRecord, error) {
	namespaces, err := netns.List()
	if err != nil {
		return nil, fmt.Errorf("harvest: list namespaces: %w", err)
	}
	var recs []bundlerListenerRecord
	var errs []error
	for _, ns := range namespaces {
		if b.cfg.NetNS != 0 && ns.Inode != b.cfg.NetNS {
			continue
		}
		err := netns.Do(ns.Path, func() error {
			r, err := readIter[bundlerListenerRecord](b.iters["harvest_tcp"])
			recs = append(recs, r...)
			if it, ok := b.iters["harvest_udp"]; ok && err == nil {
				_, err = readIter[byte](it)
			}
			return err
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("harvest netns %d: %w", ns.Inode, err))
		}
	}
	return recs, errors.Join(errs...)
}

// readIter runs an iterator once and decodes its output as records of T.
func readIter[T any](it *link.Iter) ([]T, error) {
	rd, err := it.Open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rd.Close() }() // a read-only iterator
	raw, err := io.ReadAll(rd)
	if err != nil {
		return nil, err
	}
	size := binary.Size(new(T))
	if size <= 0 || len(raw)%size != 0 {
		return nil, fmt.Errorf("iterator output of %d bytes is not a whole number of %d-byte records", len(raw), size)
	}
	recs := make([]T, len(raw)/size)
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, recs); err != nil {
		return nil, err
	}
	return recs, nil
}
