package store

// testHooks are set by this package's tests only (never concurrently with
// a write), to reach paths a real database takes rarely.
var testHooks struct {
	// failPrepare makes prepareShapes fail for the shapes it returns
	// true for, as SQLite would when out of memory.
	failPrepare func(writeShape) bool
}
