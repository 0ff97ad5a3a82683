package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/store"
)

// A --store no retry can open is refused (the agent refuses it at start);
// one that cannot be reached now is not (the agent spools until it
// answers). store.Open (look, serve) says the same line.
func TestCheckSpecRefusesOnlyWhatCanNeverWork(t *testing.T) {
	const want = "want a file path, sqlite://PATH or postgres://URL"
	for _, c := range []struct{ spec, err string }{
		{"mysql://x@y/z", `invalid --store "mysql://x@y/z": ` + want},
		{"sqlite://x://y", `invalid --store "sqlite://x://y": ` + want},
		{"mysql://u:secret@y/z", `invalid --store "mysql://u@y/z": ` + want}, // the password hidden
		{"postgres://x@y:abc/z", "invalid --store: cannot parse `postgres://x@y:abc/z`: invalid port; " + want},
		{"postgres://u:secret@h:99999/db", "invalid --store: cannot parse `postgres://u:xxxxx@h:99999/db`: invalid port; " + want},
		{"postgresql://h/db?sslmode=bogus", "invalid --store: cannot parse `postgresql://h/db?sslmode=bogus`: failed to configure TLS (sslmode is invalid); " + want},
	} {
		err := store.CheckSpec(c.spec)
		if err == nil || err.Error() != c.err {
			t.Errorf("CheckSpec(%q) = %v,\nwant %s", c.spec, err, c.err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, oerr := store.Open(ctx, c.spec)
		cancel()
		if oerr == nil || err == nil || oerr.Error() != err.Error() {
			t.Errorf("%q: CheckSpec says %v, store.Open (look, serve) %v: want the same line", c.spec, err, oerr)
		}
	}
	for _, ok := range []string{
		"", "/var/lib/deptrace/deptrace.db", "relative.db", "sqlite:///var/lib/deptrace/deptrace.db",
		"postgres://deptrace@127.0.0.1:1/deptrace",                                           // down: spooled
		"postgresql://deptrace@db.example/deptrace?sslmode=require",                          // unknown host: spooled
		"postgres://db.example/deptrace?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", // a file that may appear
	} {
		if err := store.CheckSpec(ok); err != nil {
			t.Errorf("CheckSpec(%q) = %v, want nil: it may answer later", ok, err)
		}
	}
}
