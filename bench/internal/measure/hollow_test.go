package measure

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// Every kind of hook deptrace uses has an empty program, and a hook the
// hollow side does not know is refused by name rather than skipped.
func TestHollowSpec(t *testing.T) {
	for hook, want := range map[string]ebpf.ProgramType{
		"tp_btf/sock_send_length":              ebpf.Tracing,
		"fexit/inet_sendmsg":                   ebpf.Tracing,
		"tracepoint/syscalls/sys_exit_connect": ebpf.TracePoint,
		"cgroup/getsockopt":                    ebpf.CGroupSockopt,
		"cgroup/sendmsg_unix":                  ebpf.CGroupSockAddr,
		"cgroup/sock_release":                  ebpf.CGroupSock,
	} {
		spec, err := hollowSpec(hook)
		if err != nil || spec.Type != want {
			t.Errorf("hollowSpec(%q) = %v, %v; want a %v program", hook, spec, err, want)
		}
	}
	if _, err := hollowSpec("iter/tcp (harvest)"); err != errNotPerEvent {
		t.Errorf("an iterator: %v, want errNotPerEvent", err)
	}
	for _, bad := range []string{"kprobe/tcp_sendmsg", "cgroup/connect4", "tp_btf"} {
		if _, err := hollowSpec(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("hollowSpec(%q) = %v, want an error naming it", bad, err)
		}
	}
}
