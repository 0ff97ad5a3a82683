package testnet

import "testing"

// CI systems set CI to "true" or "1"; unset, "0" and "false" are not CI.
func TestUnderCI(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "true": true, "1": true, "yes": true} {
		t.Setenv("CI", v)
		if got := UnderCI(); got != want {
			t.Errorf("CI=%q: UnderCI() = %v, want %v", v, got, want)
		}
	}
}
