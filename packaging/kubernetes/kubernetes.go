// Package kubernetes holds deptrace's Kubernetes manifests: daemonset.yaml
// runs the agent on every node (docs/operations.md, "Run as a container").
// The package's test checks what the documentation promises of them.
package kubernetes

import _ "embed"

// DaemonSet is daemonset.yaml: a Namespace and the agent's DaemonSet.
//
//go:embed daemonset.yaml
var DaemonSet []byte
