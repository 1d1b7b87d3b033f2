package main

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/test/envtestenv"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// engineDeployment is the operator's rendered engine Deployment for the DP-2 sample (the
// render golden file), so the backer is tested on what it will really see.
func engineDeployment(t *testing.T, ns string, replicas int32) *appsv1.Deployment {
	t.Helper()
	b, err := os.ReadFile("../../testdata/render/dp2tp2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---") {
		if !strings.Contains(doc, "kind: Deployment") || !strings.Contains(doc, "name: llama-70b-engine") {
			continue
		}
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		d.Namespace, d.Spec.Replicas = ns, &replicas
		return &d
	}
	t.Fatal("no engine Deployment in the golden file")
	return nil
}

// The engine runs the rendered command and args unchanged, vllm-sim standing in for vllm, with
// the container's environment resolved as the kubelet would (the downward API, a Secret) plus
// the two variables that put one pod's wildcard binds on its loopback address and pass the
// simulator's own flags.
func TestEngineCommandIsTheRenderedOne(t *testing.T) {
	d := engineDeployment(t, "llm", 1)
	c := d.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "VLLM_SIM_ARGS", Value: "--num-gpu-blocks=64"},
		corev1.EnvVar{Name: "WHERE", Value: "at $(POD_IP) $(NOPE)"})
	d.Spec.Template.Spec.Containers[0] = c
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hf-token", Namespace: "llm"}, Data: map[string][]byte{"token": []byte("hf_x")}}
	b := &Backer{Client: fake.NewClientBuilder().WithObjects(secret).Build(), SimBin: "/bin/vllm-sim", SimArgs: []string{"--time-scale=20"}}
	b.init()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e-0", Namespace: "llm"}, Spec: d.Spec.Template.Spec}
	cmd, url := b.engineCommand(context.Background(), p, "127.0.0.9")
	if want := append([]string{"vllm", "serve"}, c.Args...); cmd.Path != "/bin/vllm-sim" || !reflect.DeepEqual(cmd.Args, want) {
		t.Errorf("ran %s as %q, want /bin/vllm-sim as %q", cmd.Path, cmd.Args, want)
	}
	if url != "http://127.0.0.9:8000/health" {
		t.Errorf("health URL %s", url)
	}
	env := strings.Join(cmd.Env, "\n") + "\n"
	for _, want := range []string{"POD_IP=127.0.0.9", "PYTHONHASHSEED=42", "HF_TOKEN=hf_x", "WHERE=at 127.0.0.9 $(NOPE)",
		"VLLM_SIM_WILDCARD_HOST=127.0.0.9", "VLLM_SIM_ARGS=--num-gpu-blocks=64 --time-scale=20"} {
		if !strings.Contains(env, "\n"+want+"\n") && !strings.HasPrefix(env, want+"\n") {
			t.Errorf("environment lacks %s", want)
		}
	}
	// A container that is not the engine runs nothing here.
	p.Spec.Containers[0].Command = []string{"kvrouter"}
	if url, err := b.ensureProcess(context.Background(), p, "127.0.0.9"); err != nil || url != "" {
		t.Errorf("non-engine container: %q, %v", url, err)
	}
}

// TestBackerAgainstAPIServer runs the backer on a real kube-apiserver with real vllm-sim
// processes: pods are created from the template, get distinct loopback IPs, become Ready once
// their sims answer, map to engines through kvrouter's discovery, follow a scale 2 -> 3 -> 1,
// and go when the Deployment goes.
func TestBackerAgainstAPIServer(t *testing.T) {
	bin := testkit.Build(t, "./cmd/vllm-sim")
	env, cfg, err := envtestenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ns = "llm"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	d := engineDeployment(t, ns, 2)
	if err := c.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	b := &Backer{Client: c, Namespace: ns, Selector: labels.SelectorFromSet(labels.Set{"app.kubernetes.io/component": "engine"}),
		SimBin: bin, SimArgs: []string{"--num-gpu-blocks", "64"}, LogDir: t.TempDir()}
	defer b.StopAll()

	// waitPods reconciles until n pods are Ready, and returns them.
	waitPods := func(n int) []corev1.Pod {
		t.Helper()
		var pods corev1.PodList
		testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d Ready pods", n), func() error {
			if err := b.Reconcile(ctx); err != nil {
				t.Logf("reconcile: %v", err)
			}
			if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			ready := 0
			for _, p := range pods.Items {
				if podIsReady(&p) {
					ready++
				}
			}
			if len(pods.Items) != n || ready != n {
				return fmt.Errorf("%d pods, %d Ready", len(pods.Items), ready)
			}
			return nil
		})
		return pods.Items
	}
	pods := waitPods(2)
	ips := map[string]bool{}
	for _, p := range pods {
		if !strings.HasPrefix(p.Status.PodIP, "127.0.0.") || p.Status.PodIP == "127.0.0.1" || ips[p.Status.PodIP] {
			t.Fatalf("pod %s IP %q not a distinct loopback address (seen %v)", p.Name, p.Status.PodIP, ips)
		}
		ips[p.Status.PodIP] = true
		if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Name != d.Name || p.OwnerReferences[0].Kind != "Deployment" {
			t.Fatalf("pod %s owners %+v", p.Name, p.OwnerReferences)
		}
		if p.Labels["serving.kvroute.io/model"] != "llama-70b" || p.Annotations["serving.kvroute.io/kv-events-ports"] != "5557,5558" {
			t.Fatalf("pod %s lacks the template's labels/annotations: %v %v", p.Name, p.Labels, p.Annotations)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && time.Since(cond.LastTransitionTime.Time) > time.Minute {
				t.Fatalf("Ready lastTransitionTime %v is not now", cond.LastTransitionTime)
			}
		}
		e, ok, problems := discovery.EngineFromPod(&p, discovery.KubernetesOptions{})
		if !ok || !e.Ready || len(problems) > 0 || len(e.Events) != 2 || len(e.Replay) != 2 || e.BlockSize != 32 {
			t.Fatalf("discovery sees pod %s as %+v ok=%v problems=%v", p.Name, e, ok, problems)
		}
		// The sim really serves on that IP, with two DP ranks.
		if !httpOK("http://" + p.Status.PodIP + ":8000/health") {
			t.Fatalf("no sim answering on %s", p.Status.PodIP)
		}
	}
	var got appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKeyFromObject(d), &got); err != nil || got.Status.ReadyReplicas != 2 || got.Status.Replicas != 2 {
		t.Fatalf("deployment status %+v, %v", got.Status, err)
	}

	// Scale up and down through /scale, as the operator and the demo do.
	scale := func(n int32) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKeyFromObject(d), &got); err != nil {
			t.Fatal(err)
		}
		got.Spec.Replicas = &n
		if err := c.Update(ctx, &got); err != nil {
			t.Fatal(err)
		}
	}
	scale(3)
	pods = waitPods(3)
	seen := map[string]bool{}
	for _, p := range pods {
		if seen[p.Status.PodIP] {
			t.Fatalf("duplicate IP %s after scale-up", p.Status.PodIP)
		}
		seen[p.Status.PodIP] = true
	}
	scale(1)
	waitPods(1)

	// Deleting the Deployment removes its pods and stops their sims (no garbage collector here).
	if err := c.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	waitPods(0)
	b.mu.Lock()
	left := len(b.procs)
	b.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d sims still running after the Deployment went", left)
	}
	for ip := range ips {
		if httpOK("http://" + ip + ":8000/health") {
			t.Fatalf("a sim still answers on %s", ip)
		}
	}
}
