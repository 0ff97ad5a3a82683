// Package browsertest drives the real service-map page in Debian's
// chromium-headless-shell through chromedp, for the browser tests of
// internal/web (over a seeded store) and tests/servicemap (over the store a
// real agent wrote). It is imported by tests only.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/deptrace/deptrace/internal/testnet"
)

// Chromium finds the headless shell ($DEPTRACE_CHROMIUM first); without
// it the test skips on a laptop and fails under CI=true
// (scripts/deps.sh installs it).
func Chromium(t testing.TB) string {
	t.Helper()
	for _, p := range []string{os.Getenv("DEPTRACE_CHROMIUM"), "chromium-headless-shell", "/usr/lib/chromium/headless_shell", "chromium"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if testnet.UnderCI() {
		t.Fatal("chromium-headless-shell not found: run scripts/deps.sh (apt-get install --no-install-recommends chromium-headless-shell)")
	}
	t.Skip("chromium-headless-shell not found: run scripts/deps.sh")
	return ""
}

// Browser starts a headless Chromium with software WebGL (SwiftShader), so
// the map's WebGL renderer works on a machine without a GPU. Everything
// done in the returned context must finish within timeout; the browser
// is stopped when the test ends.
func Browser(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	return browser(t, timeout)
}

// BrowserInZone is Browser with TZ set to zone: its JavaScript dates and
// datetime-local inputs are in that zone.
func BrowserInZone(t testing.TB, zone string, timeout time.Duration) context.Context {
	t.Helper()
	return browser(t, timeout, chromedp.Env("TZ="+zone))
}

func browser(t testing.TB, timeout time.Duration, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Chromium(t)),
		chromedp.NoSandbox,
		chromedp.Flag("use-angle", "swiftshader"),
		chromedp.Flag("enable-unsafe-swiftshader", true),
		chromedp.Flag("ignore-gpu-blocklist", true),
		chromedp.WindowSize(1400, 900),
	)
	opts = append(opts, extra...)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, timeout)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// Open loads a page and waits until it has drawn its data
// (body[data-state="ready"]).
func Open(t testing.TB, ctx context.Context, url string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(`body[data-state="ready"]`))); err != nil {
		status, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#status")))
		t.Fatalf("open %s: %v (status: %s)", url, err, status)
	}
}

// JS evaluates a JavaScript expression in the page.
func JS[T any](t testing.TB, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// Until waits (at most 15 s) for a JavaScript condition, failing with
// what the expression show evaluates to.
func Until(t testing.TB, ctx context.Context, cond, show string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := chromedp.Run(wctx, chromedp.Poll[any](cond, chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		t.Fatalf("waiting for %s: %v; %s = %v", cond, err, show, JS[any](t, ctx, show))
	}
}

// Screenshot captures the page as PNG, written to $DEPTRACE_SCREENSHOTS/NAME.png
// when that is set (to look at), and returns it.
func Screenshot(t testing.TB, ctx context.Context, name string) []byte {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if dir := os.Getenv("DEPTRACE_SCREENSHOTS"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return buf
}
