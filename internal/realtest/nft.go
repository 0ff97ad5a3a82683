package realtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deptrace/deptrace/internal/testnet"
)

// LoadNftRuleset loads an nftables ruleset (nft -f) into host h's
// namespace; it goes with the namespace when the test ends.
func LoadNftRuleset(t testing.TB, h *testnet.Host, ruleset string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.nft")
	if err := os.WriteFile(path, []byte(ruleset), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := Run(t, h, 10*time.Second, "nft", "-f", path); code != 0 {
		t.Fatalf("nft -f: exit %d: %s%s", code, out, errOut)
	}
}

// NftRulePackets reads, in host h, the packets counted by the first rule
// of chain CHAIN of table "ip TABLE" whose text contains match.
func NftRulePackets(t testing.TB, h *testnet.Host, table, chain, match string) uint64 {
	t.Helper()
	code, out, errOut := Run(t, h, 10*time.Second, "nft", "list", "chain", "ip", table, chain)
	if code != 0 {
		t.Fatalf("nft list chain: exit %d: %s", code, errOut)
	}
	n, err := rulePackets(out, match)
	if err != nil {
		t.Fatalf("chain %s: %v", chain, err)
	}
	return n
}

// rulePackets finds, in `nft list chain` output, the packets of the first
// rule with a counter whose text contains match.
func rulePackets(listing, match string) (uint64, error) {
	const counter = "counter packets "
	for _, line := range strings.Split(listing, "\n") {
		i := strings.Index(line, counter)
		if i < 0 || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line[i+len(counter):])
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("counter in %q: %v", line, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("no counter on a rule with %q: %s", match, listing)
}
