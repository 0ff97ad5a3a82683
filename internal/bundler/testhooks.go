package bundler

// testHooks are the switches only tests set. Each sends the kernel side or
// the drain down a path that this kernel, or this load, would otherwise take
// rarely or never (a taken slot, a failed insert, an older kernel), so that
// the privileged tests can assert that path on any machine. Nothing outside
// the tests sets them: in deptrace every field is false.
var testHooks struct {
	// tableHarvest makes every kernel take the table harvest.
	tableHarvest bool
	// connectHash sends every connect() to the kernel side's connecting
	// hash, which otherwise serves only connects whose slot is taken.
	connectHash bool
	// noCache sends every flow to the flow map, which otherwise serves only
	// flows whose slot in the per-CPU flow cache is taken.
	noCache bool
	// recMarks makes any kernel take the task marks (copies.go).
	recMarks bool
	// spill makes the kernel side put every new flow in the spill
	// (spill_only), the path that otherwise only a failed insert takes.
	spill bool
	// noArrayBatch makes the drain read and free the flow cache and the
	// spill one slot per call, as it does on kernels without batch
	// operations on per-CPU arrays (before 5.13).
	noArrayBatch bool
	// failCommits makes that many Commits fail before doing anything, as
	// a failed delete or free would.
	failCommits int
}
