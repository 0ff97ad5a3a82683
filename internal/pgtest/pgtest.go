// Package pgtest starts a throwaway PostgreSQL cluster for tests: initdb in
// a temporary directory, a server listening only on a unix socket there,
// stopped and removed when the test ends. PostgreSQL refuses to run as
// root, so as root it runs as the postgres user.
package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
)

// BinDir finds PostgreSQL's server binaries (Debian keeps them out of PATH).
func BinDir() (string, error) {
	if matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, pg_ctl) found: apt-get install postgresql")
}

// Cluster is a running throwaway PostgreSQL.
type Cluster struct {
	DSN  string
	t    testing.TB
	bin  string
	data string
	opts string
	dir  string
	cred *syscall.Credential
}

// Start runs a cluster for the duration of the test and returns a DSN for
// its database "deptrace". A missing PostgreSQL fails the test under
// CI=true and skips it elsewhere.
func Start(t testing.TB) string {
	return New(t).DSN
}

// Stop stops the server (fast shutdown); Restart starts it again.
func (c *Cluster) Stop() { c.ctl("-m", "fast", "stop") }

// Restart starts a stopped server on the same socket and data.
func (c *Cluster) Restart() { c.ctl("-o", c.opts, "-l", filepath.Join(c.dir, "log"), "-w", "start") }

func (c *Cluster) ctl(args ...string) {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, "pg_ctl"), append([]string{"-D", c.data}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("pg_ctl %v: %v\n%s", args, err, out)
	}
}

// New is Start, returning the cluster to stop and restart it.
func New(t testing.TB) *Cluster {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		if testnet.UnderCI() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir, err := os.MkdirTemp("", "deptrace-pg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cred, err := credential()
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	data := filepath.Join(dir, "data")
	run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
	opts := fmt.Sprintf("-c listen_addresses='' -c unix_socket_directories=%s -c fsync=off -c max_connections=200", dir)
	run("pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "start")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		_ = cmd.Run() // stopping the cluster: best effort, the data dir is removed anyway
	})
	run("createdb", "-h", dir, "-U", "postgres", "deptrace")
	return &Cluster{DSN: fmt.Sprintf("postgres://postgres@/deptrace?host=%s&sslmode=disable&connect_timeout=5", dir),
		t: t, bin: bin, data: data, opts: opts, dir: dir, cred: cred}
}

// credential is the postgres user's when running as root, else nil.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to run PostgreSQL as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
