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

// Only the names New gives are taken for a test's namespaces.
func TestStaleNamespaceNames(t *testing.T) {
	for name, want := range map[string]string{"dt21177-3-br": "21177", "dt21177-3-h12": "21177", "dt5-1-h1": "5", "dtx-3-h1": "", "dt21177-3-eth0": "", "prod-dt1-1-h1": "", "dt1-1-h1-x": ""} {
		got := ""
		if m := staleNamespace.FindStringSubmatch(name); m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("%s: pid %q, want %q", name, got, want)
		}
	}
}
