package metrics

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/internal/dockertest"
)

// DeptraceStoreOverMaxSize (packaging/prometheus/deptrace-rules.yml)
// fires on the gauge this package exports once the store has been over
// its ceiling with nothing to delete for 10 minutes, and not before, nor
// on a store the ceiling brought down.
func TestStoreOverMaxSizeAlert(t *testing.T) {
	promtool := dockertest.Need(t, "promtool", "prometheus")
	if !strings.Contains(New(Options{}).gatheredNames(t), "deptrace_store_ceiling_blocked") {
		t.Fatal("deptrace_store_ceiling_blocked is not exported")
	}
	rules, err := filepath.Abs("../../packaging/prometheus/deptrace-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	test := fmt.Sprintf(`rule_files: [%q]
evaluation_interval: 1m
tests:
- interval: 1m
  input_series:
  - series: 'deptrace_store_ceiling_blocked{instance="a:9477"}'
    values: '0 0 1x30'
  - series: 'deptrace_store_ceiling_blocked{instance="b:9477"}'
    values: '0 1x5 0 1x5 0x20'
  alert_rule_test:
  - eval_time: 11m
    alertname: DeptraceStoreOverMaxSize
    exp_alerts: []
  - eval_time: 12m
    alertname: DeptraceStoreOverMaxSize
    exp_alerts:
    - exp_labels: {severity: warning, instance: "a:9477"}
      exp_annotations:
        summary: "deptrace's store (a:9477) is over --store-max-size with nothing the ceiling may delete"
        description: "All of its history is of the current hour, which the size ceiling never deletes: raise --store-max-size (the agent's log says by how much)."
`, rules)
	file := filepath.Join(t.TempDir(), "test.yml")
	if err := os.WriteFile(file, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// gatheredNames lists the names of every metric family gathered.
func (m *Metrics) gatheredNames(t *testing.T) string {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	return strings.Join(names, "\n")
}
