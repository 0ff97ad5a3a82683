package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The production binary links no plotting and no benchmark code: those
// live in cmd/deptrace-bench.
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
		for _, banned := range []string{"gonum.org/v1/plot", "github.com/deptrace/deptrace/internal/bench", "github.com/deptrace/deptrace/internal/loadgen", "github.com/deptrace/deptrace/internal/baseline"} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("deptrace links %s", p)
			}
		}
	}
}
