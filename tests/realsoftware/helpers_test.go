package realsoftware_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/realtest"
	"github.com/deptrace/deptrace/internal/testnet"
	"github.com/deptrace/deptrace/internal/tracertest"
	"github.com/deptrace/deptrace/tracer"
)

func startTracer(t *testing.T) *tracer.Tracer {
	t.Helper()
	return tracertest.Start(t, nil)
}

// readinessServer is the server block startNginx adds: 204 on
// 127.0.0.1:8081 of nginx's namespace, an address the tests' traffic
// never uses.
const readinessServer = "\tserver { listen 127.0.0.1:8081; location / { return 204; } }\n"

// startNginx runs nginx with servers (realtest.WriteNginxConf) and a
// readiness server inside host h, and returns its master and its one
// worker once the readiness server answers, with nginx's directory.
func startNginx(t *testing.T, h *testnet.Host, servers string) (master, worker int, dir string) {
	t.Helper()
	d, dir := realtest.StartNginx(t, h, readinessServer+servers)
	tracertest.Eventually(t, 15*time.Second, "nginx answers on 127.0.0.1:8081", func() error {
		if d.Exited() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %s\n%s", d.Output(), log)
		}
		c, err := h.Dial("tcp4", "127.0.0.1:8081")
		if err != nil {
			return err
		}
		_, err = realtest.HTTPGet(c)
		return err
	})
	var workers []int
	tracertest.Eventually(t, 10*time.Second, "nginx worker", func() error {
		if workers = realtest.Children(d.PID); len(workers) != 1 {
			return fmt.Errorf("nginx master %d has children %v; want one worker", d.PID, workers)
		}
		return nil
	})
	return d.PID, workers[0], dir
}
