// Package realsoftware holds privileged tests that drive real programs from
// Debian (nginx, gunicorn, curl, psql and PostgreSQL, nftables) and check
// what the public tracer package reports about them against what those
// programs really did. The tests are in realsoftware_test; see
// docs/testing.md, section "Real software".
package realsoftware
