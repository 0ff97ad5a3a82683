// Package hooks reads a tracer's hook table the way deptrace's commands
// report it: which capabilities this kernel covers, which are off by
// configuration, and a log line for each one missing.
package hooks

import (
	"log/slog"
	"slices"
	"strings"

	"github.com/deptrace/deptrace/internal/kernel"
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
		switch f, fallbackOff := offFallback(h, hooks); {
		case h.Off:
			log.Info("hook off by configuration; not traced: "+h.Provides, "hook", h.Hook, "reason", h.Reason)
		case fallbackOff:
			// Two facts, each with its own reason: the kernel's refusal
			// of h is not the configuration's doing.
			log.Info("hook unavailable on this kernel and its fallback off by configuration; not traced: "+h.Provides,
				"hook", h.Hook, "reason", h.Reason, "fallback", f.Hook, "fallback_reason", f.Reason)
		default:
			log.Warn("hook inactive; missing: "+h.Provides, "hook", h.Hook, "reason", h.Reason)
		}
	}
}

// offFallback is the fallback that would stand in for h on this kernel
// and that the configuration leaves off, if any: its Reason names the
// option.
func offFallback(h tracer.Hook, all []tracer.Hook) (tracer.Hook, bool) {
	for _, f := range all {
		if f.Off && slices.Contains(strings.Split(f.Replaces, ","), h.Program) {
			return f, true
		}
	}
	return tracer.Hook{}, false
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

// LogMissingCapabilities warns of each optional capability the process
// lacks, with what is lost without it; pins: the caller pins its kernel
// side (the agent), and so needs the PinsOnly ones too.
func LogMissingCapabilities(log *slog.Logger, pins bool) {
	for _, o := range kernel.MissingOptional() {
		if o.PinsOnly && !pins {
			continue
		}
		log.Warn("capability missing: "+o.Loses, "capability", o.Name)
	}
}
