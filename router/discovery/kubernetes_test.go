package discovery

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/test/envtestenv"
)

// TestKubernetesSource runs the source against a real kube-apiserver: pods are created,
// their status is written through the status subresource (there is no kubelet), and every
// snapshot is checked against what the pods say.
func TestKubernetesSource(t *testing.T) {
	env, cfg, err := envtestenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "models"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller-manager creates the default ServiceAccount that pod admission wants.
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	warm := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	mkPod := func(name, model string, ann map[string]string) {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann, Labels: map[string]string{
				"app.kubernetes.io/part-of": "kvroute", "app.kubernetes.io/component": "engine", "serving.kvroute.io/model": model}},
			Spec: corev1.PodSpec{
				// Bound to a node that has no kubelet, so a graceful delete leaves the pod
				// terminating until the test deletes it with grace 0.
				NodeName: "node-without-kubelet",
				Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}, {Name: "kv-events-0", ContainerPort: 5557}}}},
			},
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setStatus := func(name, ip string, ready bool, restarts int32) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cond := corev1.ConditionFalse
			if ready {
				cond = corev1.ConditionTrue
			}
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIP = ip
			p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: cond, LastTransitionTime: metav1.Now()}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm", Image: "vllm/vllm-openai", Ready: ready, RestartCount: restarts,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
			_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	// Pods that exist before the source starts.
	mkPod("engine-a", "qwen", map[string]string{
		config.DefaultEventsPortsAnnotation:   "5557,5558",
		config.DefaultReplayPortsAnnotation:   "5600,5601",
		config.DefaultSnapshotPortsAnnotation: "5700,5701",
		config.DefaultBlockSizeAnnotation:     "16",
	})
	mkPod("other-model", "llama", map[string]string{config.DefaultEventsPortsAnnotation: "5557"})
	setStatus("engine-a", "10.0.0.1", true, 0)
	setStatus("other-model", "10.0.0.9", true, 0)

	src, err := NewKubernetes(cfg, KubernetesOptions{Namespace: ns,
		Selector: "app.kubernetes.io/component=engine,serving.kvroute.io/model=qwen"})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	// Every snapshot, whatever the step, must be sorted and hold only the selected model.
	checked := func(es []Engine) {
		for i, e := range es {
			if e.Name == "other-model" {
				t.Errorf("the selector let another model's pod in: %s", show(es...))
			}
			if i > 0 && es[i-1].Name >= e.Name {
				t.Errorf("snapshot not sorted by name: %s", names(es))
			}
		}
		rec.update(es)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = src.Run(runCtx, checked) })
	defer func() {
		stop()
		wg.Wait()
		if runErr != nil {
			t.Errorf("Run: %v", runErr)
		}
	}()

	byName := func(es []Engine, name string) (Engine, bool) {
		for _, e := range es {
			if e.Name == name {
				return e, true
			}
		}
		return Engine{}, false
	}

	// The first snapshot comes from the synced cache: engine-a, annotations parsed.
	snap := rec.waitSnapshot(t, "engine-a", func(es []Engine) bool { return names(es) == "engine-a" })
	a := snap[0]
	want := Engine{Name: "engine-a", URL: "http://10.0.0.1:8000", Ready: true, BlockSize: 16,
		Events:   []string{"tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"},
		Replay:   []string{"tcp://10.0.0.1:5600", "tcp://10.0.0.1:5601"},
		Snapshot: []string{"tcp://10.0.0.1:5700", "tcp://10.0.0.1:5701"}, Incarnation: a.Incarnation}
	if !a.Equal(want) || a.Incarnation == "" {
		t.Fatalf("engine-a = %s\nwant %s", show(a), show(want))
	}
	firstIncarnation := a.Incarnation

	// A pod without an IP is not listed; once it has one but is not Ready it is listed, not Ready.
	mkPod("engine-b", "qwen", nil)
	setStatus("engine-b", "10.0.0.2", false, 0)
	snap = rec.waitSnapshot(t, "engine-b not Ready", func(es []Engine) bool {
		b, ok := byName(es, "engine-b")
		return ok && !b.Ready && len(es) == 2
	})
	if b, _ := byName(snap, "engine-b"); b.Events != nil || b.Replay != nil || b.BlockSize != 0 || b.URL != "http://10.0.0.2:8000" {
		t.Fatalf("engine-b without annotations = %s", show(b))
	}
	setStatus("engine-b", "10.0.0.2", true, 0)
	rec.waitSnapshot(t, "engine-b Ready", func(es []Engine) bool {
		b, ok := byName(es, "engine-b")
		return ok && b.Ready
	})

	// The operator patches the warm-up annotation at runtime.
	patch := `{"metadata":{"annotations":{"` + config.DefaultWarmupUntilAnnotation + `":"` + warm.Format(time.RFC3339) + `"}}}`
	if _, err := cs.CoreV1().Pods(ns).Patch(ctx, "engine-b", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitSnapshot(t, "engine-b warming", func(es []Engine) bool {
		b, ok := byName(es, "engine-b")
		return ok && b.WarmupUntil.Equal(warm)
	})

	// A container restart changes the Incarnation and nothing else.
	setStatus("engine-a", "10.0.0.1", true, 1)
	snap = rec.waitSnapshot(t, "engine-a restarted", func(es []Engine) bool {
		a, ok := byName(es, "engine-a")
		return ok && a.Incarnation != firstIncarnation
	})
	if a, _ := byName(snap, "engine-a"); a.URL != want.URL || len(a.Events) != 2 || !a.Ready {
		t.Fatalf("after restart engine-a = %s", show(a))
	}

	// A graceful delete: terminating, so listed but not Ready; then gone.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "engine-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitSnapshot(t, "engine-a terminating", func(es []Engine) bool {
		a, ok := byName(es, "engine-a")
		return ok && !a.Ready
	})
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "engine-a", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	rec.waitSnapshot(t, "engine-a deleted", func(es []Engine) bool { return names(es) == "engine-b" })

	// A new pod with the same name is a new incarnation (new UID).
	mkPod("engine-a", "qwen", nil)
	setStatus("engine-a", "10.0.0.3", true, 1)
	snap = rec.waitSnapshot(t, "engine-a recreated", func(es []Engine) bool {
		a, ok := byName(es, "engine-a")
		return ok && a.URL == "http://10.0.0.3:8000"
	})
	if a, _ := byName(snap, "engine-a"); a.Incarnation == firstIncarnation || a.Incarnation[len(a.Incarnation)-2:] != "/1" {
		t.Fatalf("recreated engine-a incarnation %q (old %q)", a.Incarnation, firstIncarnation)
	}

	// Other-model changes never produce a snapshot (checked above) and deleting everything
	// gives an empty snapshot, the true state of a scaled-to-zero model.
	for _, n := range []string{"engine-a", "engine-b"} {
		if err := cs.CoreV1().Pods(ns).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
	rec.waitSnapshot(t, "no engines", func(es []Engine) bool { return len(es) == 0 })
}
