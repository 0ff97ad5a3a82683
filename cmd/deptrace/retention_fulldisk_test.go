package main

import (
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
)

// The real agent, its SQLite store and spool on an 8 MiB tmpfs that fills
// up while it traces, then is freed: it logs one line when writing starts
// failing and one when it recovers, and the store ends with every
// connection made, once, and intact. Without a pinned kernel side the
// intervals wait in memory; with one (the default) the kernel keeps the
// interval it could not write and counts on.
func TestAgentSurvivesAFullDisk(t *testing.T) {
	testnet.RequireRoot(t)
	for i, mode := range []string{"memory", "pinned"} {
		t.Run(mode, func(t *testing.T) {
			w := newStoringWorld(t, "fulldisk-"+mode, 7430+i)
			dir := t.TempDir()
			if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=8m,mode=0700"); err != nil {
				t.Fatalf("mount a small tmpfs on %s: %v", dir, err)
			}
			t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
			w.db, w.spool = filepath.Join(dir, "deptrace.db"), filepath.Join(dir, "spool.jsonl")
			args := w.args(w.db, w.spool)
			if mode == "memory" {
				args = append(args, "--pin-path", "")
			}
			p := startReady(t, "msg=\"agent started\"", args...)
			w.connect(10)
			waitFor(t, p, "the first 10 connections stored", func() bool { return w.stored() == 10 })

			filler := filepath.Join(dir, "filler")
			fillFS(t, filler)
			w.connect(20)
			if !waitLog(p, "store and spool cannot be written") {
				t.Fatalf("no line saying writing fails on a full disk:\n%s", p.errText())
			}
			failedAt := strings.Count(p.errText(), "interval drained")
			waitFor(t, p, "three more drains on the full disk", func() bool { return strings.Count(p.errText(), "interval drained") >= failedAt+3 })
			w.connect(10)
			drained := strings.Count(p.errText(), "interval drained")
			waitFor(t, p, "two more drains", func() bool { return strings.Count(p.errText(), "interval drained") >= drained+2 })

			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			if !waitLog(p, "writing recovered") {
				t.Fatalf("no line saying writing recovered once space was freed:\n%s", p.errText())
			}
			w.connect(20)
			waitFor(t, p, "all 60 connections stored", func() bool { return w.stored() == 60 })
			p.cmd.Process.Signal(syscall.SIGTERM)
			p.wait(t)

			text := p.errText()
			for what, n := range map[string]int{"cannot be written": 1, "writing recovered": 1, "batches_dropped=0": 1} {
				if got := strings.Count(text, what); got != n {
					t.Errorf("%d lines with %q, want %d:\n%s", got, what, n, text)
				}
			}
			if strings.Contains(text, "spool full or unwritable") {
				t.Errorf("a line per refused batch:\n%s", text)
			}
			if n := w.stored(); n != 60 {
				t.Errorf("the store holds %d of 60 connections", n)
			}
			db, err := sql.Open("sqlite", w.db)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var check string
			if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
				t.Errorf("integrity_check: %q, %v", check, err)
			}
		})
	}
}

// waitFor polls cond for up to two minutes (a deadline, not a measure).
func waitFor(t *testing.T, p *proc, what string, cond func() bool) {
	t.Helper()
	for range 1200 {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("gave up waiting for %s:\n%s", what, p.errText())
}

// fillFS writes path until its file system has no byte left.
func fillFS(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for _, n := range []int{len(chunk), 4096, 512, 1} {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling the file system: %v", err)
				}
				break
			}
		}
	}
}
