package identity

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/deptrace/deptrace/tracer"
)

// Labels kubelet sets on every CRI container and sandbox.
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

// criClient asks a CRI runtime (containerd's CRI plugin, CRI-O) about its
// containers over the runtime.v1 gRPC API, the one kubelet uses: the
// container's labels name the pod, the sandbox's labels the workload.
type criClient struct {
	socket  string
	src     *source
	timeout time.Duration

	mu      sync.Mutex
	conn    *grpc.ClientConn
	rs      runtimeapi.RuntimeServiceClient
	runtime string // from Version: RuntimeContainerd or RuntimeCRIO
	version string // from Version, for doctor
}

func newCRIClient(src *source, timeout time.Duration) *criClient {
	return &criClient{socket: src.socket, src: src, timeout: timeout}
}

// unreachableError is a CRI call that got no answer from the runtime: no
// socket, no connection, no CRI service, or no reply in time.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// noAnswer says whether a gRPC call's error means the runtime did not
// answer it (rather than answering with an error, such as not found).
func noAnswer(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unimplemented:
		return true
	}
	return false
}

// isUnimplemented is a runtime that answers without the CRI service.
func isUnimplemented(err error) bool { return err != nil && status.Code(err) == codes.Unimplemented }

func (c *criClient) client(ctx context.Context) (runtimeapi.RuntimeServiceClient, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rs != nil {
		return c.rs, c.runtime, nil
	}
	if err := checkSocket(c.socket); err != nil {
		return nil, "", &unreachableError{err}
	}
	conn, err := grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, "", &unreachableError{fmt.Errorf("cri %s: %w", c.socket, err)}
	}
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	v, err := rs.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		_ = conn.Close() // the dial's error is the one to report
		return nil, "", &unreachableError{fmt.Errorf("cri %s version: %w", c.socket, err)}
	}
	c.conn, c.rs = conn, rs
	c.runtime = v.RuntimeName
	c.version = v.RuntimeName + " " + v.RuntimeVersion + ", CRI " + v.RuntimeApiVersion
	switch strings.ToLower(v.RuntimeName) {
	case "containerd":
		c.runtime = RuntimeContainerd
	case "cri-o", "crio":
		c.runtime = RuntimeCRIO
	}
	return rs, c.runtime, nil
}

// versionText connects (once) and says what the runtime is.
func (c *criClient) versionText(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if _, _, err := c.client(ctx); err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version, nil
}

func (c *criClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		_ = c.conn.Close() // nothing to report when stopping
		c.conn, c.rs = nil, nil
	}
}

// container names a CRI container (or, for a sandbox's own cgroup, its
// pod): the container's metadata and kubelet's labels, and the workload
// from its sandbox's labels. An error that is an *unreachableError got
// no answer; the caller tells the source. An answer is told here.
func (c *criClient) container(ctx context.Context, id string) (tracer.Identity, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rs, rt, err := c.client(ctx)
	if err != nil {
		return tracer.Identity{}, err
	}
	out := tracer.Identity{ContainerID: id, ContainerRuntime: rt}
	list, err := rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}})
	if err != nil {
		err = fmt.Errorf("cri list containers %s: %w", id, err)
		if noAnswer(err) {
			return out, &unreachableError{err}
		}
		return out, err
	}
	c.src.ok()
	var sandboxID string
	if len(list.Containers) == 0 {
		sandboxID = id // a sandbox (pause) container's own cgroup
	} else {
		ct := list.Containers[0]
		sandboxID = ct.PodSandboxId
		if ct.Metadata != nil {
			out.ContainerName = ct.Metadata.Name
		}
		out.K8sContainer = ct.Labels[labelContainerName]
		out.PodName, out.PodNamespace, out.PodUID = ct.Labels[labelPodName], ct.Labels[labelPodNamespace], ct.Labels[labelPodUID]
		if ct.Image != nil {
			out.ContainerImage = ct.Image.Image
		}
		// The status names the image as it was asked for, where the
		// list may give its digest.
		if st, err := rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id}); err == nil && st.Status != nil && st.Status.Image != nil &&
			st.Status.Image.Image != "" && !strings.HasPrefix(st.Status.Image.Image, "sha256:") {
			out.ContainerImage = st.Status.Image.Image
		}
	}
	sb, err := rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if err != nil {
		if len(list.Containers) == 0 {
			return out, fmt.Errorf("cri: %s is neither a container nor a sandbox: %w", id, err)
		}
		return out, nil // named without its workload
	}
	if s := sb.Status; s != nil {
		if m := s.Metadata; m != nil {
			out.PodName = cmpOr(out.PodName, m.Name)
			out.PodNamespace = cmpOr(out.PodNamespace, m.Namespace)
			out.PodUID = cmpOr(out.PodUID, m.Uid)
		}
		out.Workload = k8sWorkload(out.PodName, s.Labels)
	}
	return out, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

var ordinalRe = regexp.MustCompile(`^(.+)-[0-9]+$`)

// k8sWorkload is "Kind/name" of what made a pod, from the labels its
// controller puts on it (no API server): a Deployment's pods carry
// pod-template-hash and are named <deployment>-<hash>-<suffix>; a
// StatefulSet's carry statefulset.kubernetes.io/pod-name and are named
// <set>-<ordinal>; a DaemonSet's carry pod-template-generation beside
// controller-revision-hash; a Job's carry job-name. Other pods are
// "Pod/<name>".
func k8sWorkload(pod string, labels map[string]string) string {
	if pod == "" {
		return ""
	}
	if j := cmpOr(labels["batch.kubernetes.io/job-name"], labels["job-name"]); j != "" {
		return "Job/" + j
	}
	if h := labels["pod-template-hash"]; h != "" {
		if i := strings.LastIndex(pod, "-"+h+"-"); i > 0 {
			return "Deployment/" + pod[:i]
		}
		if i := strings.LastIndex(pod, "-"); i > 0 {
			return "ReplicaSet/" + pod[:i]
		}
	}
	if labels["statefulset.kubernetes.io/pod-name"] != "" {
		if m := ordinalRe.FindStringSubmatch(pod); m != nil {
			return "StatefulSet/" + m[1]
		}
	}
	if labels["controller-revision-hash"] != "" && labels["pod-template-generation"] != "" {
		if i := strings.LastIndex(pod, "-"); i > 0 {
			return "DaemonSet/" + pod[:i]
		}
	}
	return "Pod/" + pod
}
