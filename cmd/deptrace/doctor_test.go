package main

import (
	"strings"
	"testing"

	"github.com/deptrace/deptrace/tracer"
)

// The kernel's ENOTSUPP on an fexit attach is explained in words on arm64,
// where Debian 12's kernels lack fentry/fexit; other refusals are left as
// the kernel gave them.
func TestExplainMissing(t *testing.T) {
	fexit := tracer.Hook{Hook: "fexit/inet_sendmsg", Reason: "attach: create tracing link: not supported"}
	if got := explainMissing(fexit, "arm64"); !strings.Contains(got, "CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS") {
		t.Errorf("arm64 fexit ENOTSUPP: got %q, want the missing kernel option named", got)
	}
	if got := explainMissing(fexit, "amd64"); got == "" || strings.Contains(got, "arm64") {
		t.Errorf("amd64 fexit ENOTSUPP: got %q, want a generic explanation", got)
	}
	other := tracer.Hook{Hook: "fexit/inet_sendmsg", Reason: "load: permission denied"}
	if got := explainMissing(other, "arm64"); got != "" {
		t.Errorf("another refusal: got %q, want none", got)
	}
	tp := tracer.Hook{Hook: "tp_btf/sock_send_length", Reason: "attach: not supported"}
	if got := explainMissing(tp, "arm64"); got != "" {
		t.Errorf("a tracepoint: got %q, want none", got)
	}
}
