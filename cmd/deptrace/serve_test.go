package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestServeBeyondLoopbackNeedsToken(t *testing.T) {
	db := seedStore(t, "")
	for _, c := range []struct {
		args []string
		env  []string
	}{
		{[]string{"serve", "--store", db, "--listen", "0.0.0.0:7777"}, nil},
		{[]string{"serve", "--store", db}, []string{"DEPTRACE_LISTEN=:7777"}},
	} {
		_, stderr, code := run(t, c.env, c.args...)
		if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "--token-file is required") {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 1 and one line naming --token-file", c.env, c.args, code, stderr)
		}
	}
	_, stderr, code := run(t, nil, "serve", "--store", filepath.Join(t.TempDir(), "none.db"))
	if code != 1 || !strings.Contains(stderr, "no store at") {
		t.Errorf("missing store: exit %d %q", code, stderr)
	}
	_, stderr, code = run(t, nil, "serve", "--store", db, "--cache-mb", "-1")
	if code != 1 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "invalid --cache-mb -1") {
		t.Errorf("--cache-mb -1: exit %d, stderr %q; want exit 1 and one line naming --cache-mb", code, stderr)
	}
}

// The served graph is what `deptrace graph --format json` prints, and a
// token file, once given, is required on every request.
func TestServeAnswersLikeGraph(t *testing.T) {
	db := seedStore(t, "")
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startReady(t, "msg=serving", "serve", "--store", db, "--listen", "127.0.0.1:0", "--token-file", token)
	base := regexp.MustCompile(`url=(http://\S+/)`).FindStringSubmatch(p.errText())
	if base == nil {
		t.Fatalf("no url in %q", p.errText())
	}
	want, stderr, code := run(t, nil, "graph", "--format", "json", "--store", db, "--since", "3h")
	if code != 0 {
		t.Fatalf("graph: %d %s", code, stderr)
	}
	get := func(auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base[1]+"api/graph?since=3h", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d %s", code, body)
	}
	// The API sends the CLI's document without indentation.
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(want)); err != nil {
		t.Fatalf("graph --format json is not JSON: %v", err)
	}
	code, body := get("Bearer 0123456789abcdef0123")
	if code != 200 || strings.TrimSpace(body) != compact.String() {
		t.Errorf("with token: %d\n%s\nwant graph --format json, compacted:\n%s", code, body, compact.String())
	}
}
