// Package servicemap holds a privileged test of the service map on a real
// stack: curl -> nginx -> a Python app under gunicorn -> redis-server,
// memcached, PostgreSQL and a UDP collector, each server in a network
// namespace of its own, traced by the real `deptrace agent`, shown by the
// real `deptrace serve` in headless Chromium. The tests are in
// servicemap_test; see docs/testing.md, section "Service map on a real
// stack".
package servicemap
