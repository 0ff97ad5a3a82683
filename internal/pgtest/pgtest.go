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

// Start runs a cluster for the duration of the test and returns a DSN for
// its database "deptrace". A missing PostgreSQL fails the test under
// CI=true and skips it elsewhere.
func Start(t testing.TB) string {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir, err := os.MkdirTemp("", "deptrace-pg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
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
		cmd.Run()
	})
	run("createdb", "-h", dir, "-U", "postgres", "deptrace")
	return fmt.Sprintf("postgres://postgres@/deptrace?host=%s&sslmode=disable", dir)
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
