package hooks

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/deptrace/deptrace/tracer"
)

// A hook the kernel refused whose fallback the configuration leaves off
// is logged with both reasons, each under its own key: the refusal is not
// the configuration's doing. A hook off by configuration itself, and one
// missing with no fallback, keep their lines.
func TestLogUncoveredTellsRefusalFromConfiguration(t *testing.T) {
	hooks := []tracer.Hook{
		{Program: "connect_exit", Hook: "fexit/inet_stream_connect", Provides: "early connect failures", Reason: "fexit refused: operation not permitted"},
		{Program: "sys_connect", Hook: "tracepoint/syscalls/sys_exit_connect", Provides: "early connect failures", Replaces: "connect_exit", Off: true, Reason: "off: --syscall-tracepoints turns it on"},
		{Program: "on_send", Hook: "tp_btf/sock_send_length", Provides: "sends", Reason: "no such tracepoint"},
		{Program: "on_recv", Hook: "tp_btf/sock_recv_length", Provides: "receives", Active: true},
	}
	var buf bytes.Buffer
	LogUncovered(slog.New(slog.NewTextHandler(&buf, nil)), hooks)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got:\n%s", buf.String())
	}
	for i, want := range [][]string{
		{"level=INFO", "hook unavailable on this kernel and its fallback off by configuration", "hook=fexit/inet_stream_connect", `reason="fexit refused: operation not permitted"`, "fallback=tracepoint/syscalls/sys_exit_connect", `fallback_reason="off: --syscall-tracepoints turns it on"`},
		{"level=INFO", "hook off by configuration", "hook=tracepoint/syscalls/sys_exit_connect", `reason="off: --syscall-tracepoints turns it on"`},
		{"level=WARN", "hook inactive; missing: sends", "hook=tp_btf/sock_send_length", `reason="no such tracepoint"`},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d lacks %q: %s", i+1, w, lines[i])
			}
		}
	}
}
