package discovery

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kvroute/kvroute/router/config"
)

func enginePod(ip string, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u1", Annotations: ann},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "sidecar", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 9}}},
			{Name: "vllm", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 1}, {Name: "http", ContainerPort: 8000}}},
		}},
		Status: corev1.PodStatus{
			PodIP:             ip,
			Phase:             corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "sidecar", RestartCount: 7}, {Name: "vllm", RestartCount: 2}},
		},
	}
}

func TestEngineFromPod(t *testing.T) {
	ann := map[string]string{
		config.DefaultEventsPortsAnnotation:   "5557,5558",
		config.DefaultReplayPortsAnnotation:   "5600, 5601",
		config.DefaultSnapshotPortsAnnotation: "5700,5701",
		config.DefaultBlockSizeAnnotation:     "32",
		config.DefaultWarmupUntilAnnotation:   "2026-05-06T07:08:09Z",
	}
	e, ok, problems := EngineFromPod(enginePod("fd00::7", ann), KubernetesOptions{})
	if !ok || len(problems) > 0 {
		t.Fatalf("ok=%v problems=%v", ok, problems)
	}
	want := Engine{
		Name: "p", URL: "http://[fd00::7]:8000", Ready: true, Incarnation: "u1/2", BlockSize: 32,
		Events:      []string{"tcp://[fd00::7]:5557", "tcp://[fd00::7]:5558"},
		Replay:      []string{"tcp://[fd00::7]:5600", "tcp://[fd00::7]:5601"},
		Snapshot:    []string{"tcp://[fd00::7]:5700", "tcp://[fd00::7]:5701"},
		WarmupUntil: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC),
	}
	if !e.Equal(want) {
		t.Fatalf("got %s\nwant %s", show(e), show(want))
	}

	// An explicit port and container win; a rank without a port is "".
	e, ok, _ = EngineFromPod(enginePod("10.1.2.3", map[string]string{config.DefaultEventsPortsAnnotation: "5557,,5559"}),
		KubernetesOptions{Port: 8080, Container: "sidecar"})
	if !ok || e.URL != "http://10.1.2.3:8080" || e.Incarnation != "u1/7" ||
		strings.Join(e.Events, " ") != "tcp://10.1.2.3:5557  tcp://10.1.2.3:5559" {
		t.Fatalf("got %s", show(e))
	}
}

// A pod says its engine kind by annotation; an unknown kind is a problem and is kept as
// written, so the fleet refuses the pod rather than routing it as its own kind.
func TestEngineFromPodKind(t *testing.T) {
	e, ok, problems := EngineFromPod(enginePod("10.0.0.1", map[string]string{EngineKindAnnotation: "SGLang"}), KubernetesOptions{})
	if !ok || len(problems) > 0 || e.Kind != "sglang" {
		t.Fatalf("kind %q ok=%v problems=%v", e.Kind, ok, problems)
	}
	e, _, problems = EngineFromPod(enginePod("10.0.0.1", map[string]string{EngineKindAnnotation: "tgi"}), KubernetesOptions{})
	if len(problems) != 1 || MixedKinds("vllm", []Engine{e}) == nil {
		t.Fatalf("kind %q problems=%v: want one problem and the engine refused", e.Kind, problems)
	}
}

// A pod that publishes a topic other than <prefix>@<pod IP>@<model> (the operator's
// TensorRT-LLM pods, whose config every pod shares) names it; other pods leave it empty.
func TestEngineFromPodTopic(t *testing.T) {
	e, ok, problems := EngineFromPod(enginePod("10.0.0.1", map[string]string{config.TopicAnnotation: "kv@m-engine@m"}), KubernetesOptions{})
	if !ok || len(problems) > 0 || e.Topic != "kv@m-engine@m" {
		t.Fatalf("topic %q ok=%v problems=%v", e.Topic, ok, problems)
	}
	if e, _, _ = EngineFromPod(enginePod("10.0.0.1", nil), KubernetesOptions{}); e.Topic != "" {
		t.Fatalf("topic %q without the annotation", e.Topic)
	}
}

func TestEngineFromPodProblems(t *testing.T) {
	ann := map[string]string{
		config.DefaultEventsPortsAnnotation: "5557",
		config.DefaultReplayPortsAnnotation: "5600,5601",
		config.DefaultBlockSizeAnnotation:   "sixteen",
		config.DefaultWarmupUntilAnnotation: "soon",
	}
	e, ok, problems := EngineFromPod(enginePod("10.0.0.1", ann), KubernetesOptions{})
	if !ok {
		t.Fatal("a pod with bad annotations must stay listed (routable, approximate)")
	}
	if len(e.Events) != 1 || e.Replay != nil || e.BlockSize != 0 || !e.WarmupUntil.IsZero() {
		t.Fatalf("bad annotations not ignored: %s", show(e))
	}
	all := strings.Join(problems, "\n")
	for _, want := range []string{"lists 2 ports but", "not a block size", "not an RFC 3339 time"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems %q do not mention %q", all, want)
		}
	}
	// A pod whose engine dials a router in bound mode has no event ports, only replay ones.
	e, _, problems = EngineFromPod(enginePod("10.0.0.1", map[string]string{config.DefaultReplayPortsAnnotation: "5600,5601"}), KubernetesOptions{})
	if len(problems) != 0 || e.Events != nil || strings.Join(e.Replay, " ") != "tcp://10.0.0.1:5600 tcp://10.0.0.1:5601" || e.Ranks() != 2 {
		t.Fatalf("replay-only pod: %s %v", show(e), problems)
	}
	// A snapshot port list of the wrong length, or a bad port, is ignored with its reason.
	for _, snap := range []string{"5700", "5700,x"} {
		e, _, problems = EngineFromPod(enginePod("10.0.0.1", map[string]string{
			config.DefaultEventsPortsAnnotation: "5557,5558", config.DefaultSnapshotPortsAnnotation: snap}), KubernetesOptions{})
		if len(problems) != 1 || !strings.Contains(problems[0], "snapshot ignored") || e.Snapshot != nil || len(e.Events) != 2 {
			t.Errorf("snapshot ports %q: %s %v", snap, show(e), problems)
		}
	}
	_, _, problems = EngineFromPod(enginePod("10.0.0.1", map[string]string{config.DefaultEventsPortsAnnotation: "5557,x"}), KubernetesOptions{})
	if len(problems) != 1 || !strings.Contains(problems[0], "rank 1") {
		t.Errorf("bad events port: %v", problems)
	}

	if _, ok, _ := EngineFromPod(enginePod("", nil), KubernetesOptions{}); ok {
		t.Error("a pod without an IP was listed")
	}
	done := enginePod("10.0.0.1", nil)
	done.Status.Phase = corev1.PodFailed
	if _, ok, _ := EngineFromPod(done, KubernetesOptions{}); ok {
		t.Error("a failed pod was listed")
	}
	noPort := enginePod("10.0.0.1", nil)
	noPort.Spec.Containers = []corev1.Container{{Name: "vllm"}}
	if _, ok, problems := EngineFromPod(noPort, KubernetesOptions{}); ok || len(problems) == 0 {
		t.Errorf("a pod without an HTTP port: ok=%v problems=%v", ok, problems)
	}
	terminating := enginePod("10.0.0.1", nil)
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if e, ok, _ := EngineFromPod(terminating, KubernetesOptions{}); !ok || e.Ready {
		t.Errorf("a terminating pod: ok=%v ready=%v, want listed and not Ready", ok, e.Ready)
	}
}

func TestNewKubernetesRefusesBadOptions(t *testing.T) {
	cases := []struct {
		o       KubernetesOptions
		wantErr string
	}{
		{KubernetesOptions{Selector: "a=b"}, "namespace is required"},
		{KubernetesOptions{Namespace: "n"}, "selector is required"},
		{KubernetesOptions{Namespace: "n", Selector: "a in (b"}, "selector \"a in (b\""},
		{KubernetesOptions{Namespace: "n", Selector: "a=b", Port: 70000}, "port 70000"},
	}
	for _, tc := range cases {
		if _, err := NewKubernetes(&restConfigForOptionsTest, tc.o); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("NewKubernetes(%+v) = %v, want an error mentioning %q", tc.o, err, tc.wantErr)
		}
	}
}

var restConfigForOptionsTest = rest.Config{Host: "https://127.0.0.1:1"}

// A disaggregated model's pods name their pool in the operator's role label; an unknown value
// is reported and the pod routed as one that computes whole requests.
func TestEngineFromPodRole(t *testing.T) {
	for _, c := range []struct {
		label, want string
		problem     bool
	}{{"", "", false}, {config.RolePrefill, config.RolePrefill, false}, {config.RoleDecode, config.RoleDecode, false}, {"encode", "", true}} {
		p := enginePod("10.0.0.1", nil)
		if c.label != "" {
			p.Labels = map[string]string{config.DefaultRoleLabel: c.label}
		}
		e, ok, problems := EngineFromPod(p, KubernetesOptions{})
		if !ok || e.Role != c.want || (len(problems) > 0) != c.problem {
			t.Errorf("label %q: ok=%v role=%q problems=%v", c.label, ok, e.Role, problems)
		}
		if c.problem && !strings.Contains(problems[0], `"encode" is neither "prefill" nor "decode"`) {
			t.Errorf("problem %q does not name the value", problems[0])
		}
	}
	a, b := Engine{Name: "p"}, Engine{Name: "p", Role: config.RolePrefill}
	if a.Equal(b) {
		t.Error("a role change is not a change of the snapshot")
	}
}
