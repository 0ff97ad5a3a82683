// Package container holds the privileged test that runs deptrace from its
// own container image (packaging/ociimage, what `make image` builds) under a
// dockerd of the test's own, the way docs/operations.md ("Run as a
// container") tells operators to, and checks that it names the other
// containers on the machine. The test is in container_test.
package container
