package bundler

import (
	"slices"
	"testing"
)

// The copies each kernel gets, in attach order, and the object's program
// each is loaded from.
func TestCopyNames(t *testing.T) {
	state := hookDef{program: "on_tcp_state", copies: copiesAlways}
	send := hookDef{program: "on_send", copies: copiesPreemptible}
	if got := copyNames(state, false); !slices.Equal(got, []string{"on_tcp_state_last"}) {
		t.Errorf("flag mode: %v", got)
	}
	if got := copyNames(state, true); !slices.Equal(got, []string{"on_tcp_state_mid1", "on_tcp_state_last"}) {
		t.Errorf("marks mode: %v", got)
	}
	if got := copyNames(send, false); got != nil {
		t.Errorf("sends before 6.19 need no copies: %v", got)
	}
	if got := copySource("on_send_mid1"); got != "on_send_mid" {
		t.Errorf("copySource: %s", got)
	}
	if got := copySource("on_send_last"); got != "on_send_last" {
		t.Errorf("copySource: %s", got)
	}
}
