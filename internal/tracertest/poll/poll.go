// Package poll waits for a condition with a bound. It imports nothing of
// deptrace, so that every package's tests can use it, internal/bundler's
// included (package tracertest, which imports tracer, cannot be).
package poll

import "time"

// Until calls cond every interval until it returns nil, and returns nil;
// after limit it returns cond's last error.
func Until(limit, interval time.Duration, cond func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(interval)
	}
}

// True calls cond every interval until it holds or limit passes, and
// reports whether it held.
func True(limit, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// Settle calls step every 20 ms until done holds or limit passes, then
// twice more, 50 ms apart, to catch anything counted twice (or late); it
// reports whether done held. Tests that sum drained counts use it: a count
// arrives when the kernel counted it, not when the traffic ended.
func Settle(limit time.Duration, done func() bool, step func()) bool {
	held := True(limit, 20*time.Millisecond, func() bool {
		if done() {
			return true
		}
		step()
		return false
	})
	step()
	time.Sleep(50 * time.Millisecond)
	step()
	return held
}
