package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The production binary links no plotting and no benchmark code: those
// live under bench/ (the deptrace-bench binary), and the load generator,
// which the tracer's tests share with it, stays out of the binary too.
func TestBinaryLinksNoBenchmarkCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !slices.Contains(deps, "github.com/deptrace/deptrace/tracer") {
		t.Fatalf("go list -deps gave an implausible list (%d packages):\n%s", len(deps), out)
	}
	for _, p := range deps {
		for _, banned := range []string{"gonum.org/v1/plot", "github.com/deptrace/deptrace/bench", "github.com/deptrace/deptrace/internal/loadgen"} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("deptrace links %s", p)
			}
		}
	}
}
