package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/deptrace/deptrace/internal/store"
)

// spool keeps batches on disk, one JSON line each, while the store is
// unreachable. It is bounded: past max bytes new batches are dropped and
// counted, never silently.
type spool struct {
	path        string
	max         int64
	dropped     uint64 // batches refused
	lastRefused string // the batch id last refused
}

// SpoolStatus reports how much waits in the spool at path (for doctor).
func SpoolStatus(path string) (bytes int64, batches int, err error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }() // read-only
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<30)
	for s.Scan() {
		batches++
		bytes += int64(len(s.Bytes()) + 1)
	}
	return bytes, batches, s.Err()
}

func (s *spool) size() int64 {
	st, err := os.Stat(s.path)
	if err != nil {
		return 0
	}
	return st.Size()
}

func (s *spool) pending() bool { return s.size() > 0 }

// add appends b, or counts it refused: once per batch, though a pinned
// kernel side collects a refused interval again, under the same batch id,
// each interval until it is written.
func (s *spool) add(b store.Batch) error {
	err := s.write(b)
	if err != nil && (b.ID == "" || b.ID != s.lastRefused) {
		s.dropped++
		s.lastRefused = b.ID
	}
	return err
}

func (s *spool) write(b store.Batch) error {
	line, err := json.Marshal(b)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if n := int64(len(line)); n > s.max {
		// However empty the spool, this batch never fits.
		return fmt.Errorf("%w: batch of %s is larger than --spool-max %s: raise --spool-max", errBatchTooLarge, sizeText(n), sizeText(s.max))
	} else if used := s.size(); used+n > s.max {
		return fmt.Errorf("%w: %s of --spool-max %s used, the batch needs %s", errSpoolFull, sizeText(used), sizeText(s.max), sizeText(n))
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(s.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	// A write cut short by a full disk leaves part of a line: cut it off,
	// or the next batch would be appended to it and both be unreadable.
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		_ = f.Close() // the seek's error is the one to report
		return err
	}
	if _, err := f.Write(line); err != nil {
		err = errors.Join(err, f.Truncate(end))
		_ = f.Close() // the write's error is the one to report
		return err
	}
	// The batch's counts are reset in a pinned kernel side once it is
	// here: on disk, not only in the page cache. A spool file this call
	// created is on disk only once its directory entry is too.
	if err := f.Sync(); err != nil {
		err = errors.Join(err, f.Truncate(end))
		_ = f.Close() // the sync's error is the one to report
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if end == 0 {
		if err := syncDir(filepath.Dir(s.path)); err != nil {
			return err
		}
	}
	return nil
}

var errBatchTooLarge = errors.New("spool cannot take the batch")

// sizeText writes a size of bytes for a message: in the largest binary
// unit it reaches, with one decimal unless it is whole (3.1 MiB, 1 MiB,
// 512 bytes).
func sizeText(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	if n < 1<<10 {
		return fmt.Sprintf("%d bytes", n)
	}
	u, div := 0, int64(1<<10)
	for u < len(units)-1 && n >= div<<10 {
		u, div = u+1, div<<10
	}
	if n%div == 0 {
		return fmt.Sprintf("%d %s", n/div, units[u])
	}
	// A value that rounds to 1024 of a unit is 1.0 of the next.
	if u < len(units)-1 && float64(n)/float64(div) >= 1023.95 {
		u, div = u+1, div<<10
	}
	return fmt.Sprintf("%.1f %s", float64(n)/float64(div), units[u])
}

// syncDir makes a directory's entries durable (a file just created or
// renamed into it), as fsync of the file alone does not.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// replay writes spooled batches in order with write; what fails stays in
// the spool, in order, for the next try.
func (s *spool) replay(write func(store.Batch) error) (int, error) {
	data, err := os.ReadFile(s.path)
	if err != nil {
		if os.IsNotExist(err) {
			return 0, nil
		}
		return 0, err
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	written := 0
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var b store.Batch
		if err := json.Unmarshal(line, &b); err != nil {
			continue // a torn last line from a crash
		}
		if err := write(b); err != nil {
			if werr := replaceFile(s.path, bytes.Join(lines[i:], nil)); werr != nil {
				return written, werr
			}
			return written, err
		}
		written++
	}
	return written, os.Truncate(s.path, 0)
}

// replaceFile gives path new contents atomically: a process killed
// meanwhile leaves either the old contents or the new, never a truncated
// spool.
func replaceFile(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	defer func() {
		if err != nil {
			_ = os.Remove(tmp) // a full disk: leave it the space; the write's error is the one to report
		}
	}()
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close() // the write's error is the one to report
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close() // the sync's error is the one to report
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}
