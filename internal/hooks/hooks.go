// Package hooks reads a tracer's hook table the way deptrace's commands
// report it: which capabilities this kernel covers, which are off by
// configuration, and a log line for each one missing.
package hooks

import (
	"log/slog"
	"slices"
	"strings"

	"github.com/deptrace/deptrace/tracer"
)

// LogUncovered logs each capability this kernel side lacks: at warning
// level when the kernel cannot give it, at info level when the
// configuration leaves its hook off.
func LogUncovered(log *slog.Logger, hooks []tracer.Hook) {
	for _, h := range hooks {
		if h.Active && h.CopiesMissing != "" {
			log.Warn("copies not attached: runs the kernel skips for recursion are lost (counted as recursion_misses)", "hook", h.Hook, "reason", h.CopiesMissing)
		}
		if Covered(h, hooks) {
			continue
		}
		if off, why := OffByConfig(h, hooks); off {
			log.Info("hook off by configuration; not traced: "+h.Provides, "hook", h.Hook, "reason", why)
		} else {
			log.Warn("hook inactive; missing: "+h.Provides, "hook", h.Hook, "reason", h.Reason)
		}
	}
}

// OffByConfig reports whether what h provides is missing only because the
// configuration leaves a hook off: h itself, or the fallback that would
// stand in for it on this kernel. Its Reason, or that fallback's, names the
// option.
func OffByConfig(h tracer.Hook, all []tracer.Hook) (bool, string) {
	if h.Off {
		return true, h.Reason
	}
	for _, f := range all {
		if f.Off && slices.Contains(strings.Split(f.Replaces, ","), h.Program) {
			return true, f.Reason
		}
	}
	return false, ""
}

// Covered reports whether what h provides works on this kernel: h runs,
// or a fallback that replaces it runs, or h is itself a fallback that is
// not needed.
func Covered(h tracer.Hook, all []tracer.Hook) bool {
	if h.Active || h.Standby {
		return true
	}
	for _, f := range all {
		if f.Active && slices.Contains(strings.Split(f.Replaces, ","), h.Program) {
			return true
		}
	}
	return false
}
