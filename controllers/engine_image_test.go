package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

// untestedEvents lists the UntestedEngineImage events about m.
func untestedEvents(t *testing.T, m *v1alpha1.KVRoutedModel) []eventsv1.Event {
	t.Helper()
	evs := &eventsv1.EventList{}
	if err := k8s.List(ctx, evs, client.InNamespace(m.Namespace)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range evs.Items {
		if e.Regarding.UID == m.UID && e.Reason == ReasonUntestedEngineImage {
			out = append(out, e)
		}
	}
	return out
}

// A model whose engine image is not a tested vLLM release gets a Warning event naming the
// image and the tested tags; one on a tested release gets none.
func TestUntestedEngineImageWarns(t *testing.T) {
	ns := namespace(t, "engine-image")
	tested := render.VLLMImage + ":" + render.TestedVLLMReleases[0].Tag
	good := newModel(t, ns, "good", func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.Image = tested })
	bad := newModel(t, ns, "bad", func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.Image = "vllm/vllm-openai:latest" })

	eventually(t, 20*time.Second, func() error {
		evs := untestedEvents(t, bad)
		if len(evs) == 0 {
			return fmt.Errorf("no %s event about %s", ReasonUntestedEngineImage, bad.Name)
		}
		e := evs[0]
		if e.Type != "Warning" || !strings.Contains(e.Note, "vllm/vllm-openai:latest") || !strings.Contains(e.Note, render.TestedVLLMReleases[0].Tag) {
			return fmt.Errorf("event %s %q", e.Type, e.Note)
		}
		return nil
	})
	// Both models reconciled (observedGeneration caught up) before looking for absent events.
	waitCondition(t, good, v1alpha1.ConditionAvailable, "False/NoReplicasReady")
	if evs := untestedEvents(t, good); len(evs) != 0 {
		t.Errorf("tested image %s drew %d %s events: %q", tested, len(evs), ReasonUntestedEngineImage, evs[0].Note)
	}

	// Moving the bad model to a tested release stops the warnings; moving the good one to an
	// untested image starts them.
	updateModel(t, good, func(m *v1alpha1.KVRoutedModel) { m.Spec.Engine.Image = "registry.example/vllm/vllm-openai:v0.9.0" })
	eventually(t, 20*time.Second, func() error {
		if len(untestedEvents(t, good)) == 0 {
			return fmt.Errorf("no %s event after the image change", ReasonUntestedEngineImage)
		}
		return nil
	})
}

func TestEngineImageTested(t *testing.T) {
	tag := render.TestedVLLMReleases[0].Tag
	for image, want := range map[string]bool{
		"vllm/vllm-openai:" + tag:           true,
		"docker.io/vllm/vllm-openai:" + tag: true,
		"docker.io/vllm/vllm-openai:" + tag + "@sha256:" + strings.Repeat("a", 64): true,
		"ghcr.io/kvroute/vllm-sim:v0.1.0":                                          true,
		"vllm/vllm-openai:latest":                                                  false,
		"vllm/vllm-openai":                                                         false,
		"vllm/vllm-openai@sha256:" + strings.Repeat("a", 64):                       false,
		"vllm/vllm-openai:v0.9.0":                                                  false,
		"example.com/my-vllm:" + tag:                                               false,
		"localhost:5000/vllm/vllm-openai:" + tag:                                   true,
	} {
		if got, _ := render.EngineImageTested(image); got != want {
			t.Errorf("EngineImageTested(%q) = %v, want %v", image, got, want)
		}
	}
	if strings.Contains(render.DefaultEngineImage, "latest") || strings.Contains(render.DefaultRouterImage, "latest") {
		t.Errorf("defaults %s %s use latest", render.DefaultEngineImage, render.DefaultRouterImage)
	}
	if ok, _ := render.EngineImageTested(render.DefaultEngineImage); !ok {
		t.Errorf("the default engine image %s is not a tested release", render.DefaultEngineImage)
	}
}
