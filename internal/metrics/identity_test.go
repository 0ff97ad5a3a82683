package metrics

import (
	"strings"
	"testing"

	"github.com/deptrace/deptrace/tracer"
)

// With Identity on, dependency series carry the workload and the
// container's name (never ids, pod names or images); past the cap, new
// pairs read _other and are counted. Off (the default), labels are as
// before.
func TestIdentityLabelsAreBoundedAndOptional(t *testing.T) {
	pod := tracer.Identity{ContainerID: "4f1c", ContainerName: "k8s_app_checkout-x2x4k", PodNamespace: "shop", PodName: "checkout-7d4b9c-x2x4k",
		PodUID: "0e6b", K8sContainer: "app", Workload: "Deployment/checkout", ContainerImage: "checkout:1.4", ContainerRuntime: "containerd"}
	compose := tracer.Identity{ContainerID: "9a9a", ContainerName: "shop-web-1", Workload: "compose/shop/web", ContainerRuntime: "docker"}
	oneshot := tracer.Identity{ContainerID: "0b5e", ContainerName: "sleepy_turing", ContainerRuntime: "docker"}
	unit := tracer.Identity{Unit: "nginx.service"}
	flows := func() []tracer.Flow {
		var fs []tracer.Flow
		for _, id := range []tracer.Identity{pod, compose, oneshot, unit} {
			f := outbound(7, "10.0.1.5", "10.0.1.10", 3306, tracer.Counters{Connections: 1})
			f.Identity = id
			fs = append(fs, f)
		}
		return fs
	}

	off := New(Options{})
	off.ObserveInterval(tracer.Interval{Flows: flows()}, hostOf, 0)
	if got := scrape(t, off, "deptrace_outbound_connections_total"); strings.Contains(got, "workload") || strings.Count(got, "\n") != 1 {
		t.Errorf("identity off: %s", got)
	}

	on := New(Options{Identity: true, MaxIdentityValues: 2})
	on.ObserveInterval(tracer.Interval{Flows: flows()}, hostOf, 0)
	got := scrape(t, on, "deptrace_outbound_connections_total", "deptrace_metrics_identity_capped_total")
	for _, want := range []string{
		"deptrace_outbound_connections_total{container=app,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10,workload=Deployment/checkout} 1",
		"deptrace_outbound_connections_total{container=shop-web-1,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10,workload=compose/shop/web} 1",
		"deptrace_outbound_connections_total{container=_other,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10,workload=_other} 1",
		"deptrace_outbound_connections_total{container=,host=web-1,port=3306,process=php-fpm,proto=tcp,remote=10.0.1.10,workload=} 1",
		"deptrace_metrics_identity_capped_total{} 1",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("missing %s in\n%s", want, got)
		}
	}
	for _, never := range []string{pod.ContainerID, pod.PodUID, pod.PodName, pod.ContainerImage, "sleepy_turing"} {
		if strings.Contains(got, never) {
			t.Errorf("label value %q exposed:\n%s", never, got)
		}
	}
}
