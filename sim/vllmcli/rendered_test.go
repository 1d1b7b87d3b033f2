package vllmcli_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/sim/vllmcli"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// renderedEngine admits config/samples/serving_v1alpha1_kvroutedmodel_<shape>.yaml through the
// CRD and renders its engine container with the operator's renderer.
func renderedEngine(t *testing.T, shape string) corev1.Container {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../config/samples", "serving_v1alpha1_kvroutedmodel_"+shape+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := validation.New()
	if err != nil {
		t.Fatal(err)
	}
	m, err := v.Admit(context.Background(), b, "default")
	if err != nil {
		t.Fatal(err)
	}
	d, err := render.EngineDeployment(m, render.Options{DefaultEngineImage: "vllm/vllm-openai:test"})
	if err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Spec.Containers[0]
}

// podEnv is the container's environment as the kubelet would give it on a pod with ip:
// literal values and status.podIP; secrets read as "secret".
func podEnv(c corev1.Container, ip string) func(string) (string, bool) {
	m := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			m[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			m[e.Name] = ip
		default:
			m[e.Name] = "secret"
		}
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// The operator's rendered engine command, through the renderer itself, for the samples: every
// flag it writes is read, the settings land where the simulator uses them, and only flags
// that matter to a GPU are ignored.
func TestRenderedEngineCommands(t *testing.T) {
	for _, c := range []struct {
		shape   string
		check   func(vllmsim.Config) bool
		ignored string
	}{
		{shape: "sim", ignored: "--tensor-parallel-size",
			check: func(c vllmsim.Config) bool {
				return c.Model == "qwen3-0-6b" && c.Host == "0.0.0.0" && c.Port == 8000 && c.BlockSize == 16 && c.HashAlgo == "sha256" &&
					c.DataParallelSize == 2 && c.KVEventsBind == "tcp://*:5557" && c.KVReplayBind == "tcp://*:5600" &&
					*c.KVEventsTopic == "kv@10.0.0.7@qwen3-0-6b" && c.HWM == 100000 && c.BufferSteps == 10000 && !c.OmitPromptTokensDetails
			}},
		{shape: "dp2tp2", ignored: "--tensor-parallel-size --revision --gpu-memory-utilization",
			check: func(c vllmsim.Config) bool {
				return c.Model == "llama-3-70b" && c.BlockSize == 32 && c.HashAlgo == "sha256_cbor" && c.DataParallelSize == 2 &&
					c.MaxModelLen == 32768 && c.KVEventsBind == "tcp://*:5557" && *c.KVEventsTopic == "kv@10.0.0.7@llama-3-70b"
			}},
		{shape: "lora", ignored: "--tensor-parallel-size --max-lora-rank",
			check: func(c vllmsim.Config) bool { return len(c.LoRAAdapters) > 0 }},
		// The decode pool of a disaggregated model: NIXL on the pod's IP.
		{shape: "pd", ignored: "--tensor-parallel-size",
			check: func(c vllmsim.Config) bool {
				k := c.KVTransfer
				return k != nil && k.Connector == "NixlConnector" && k.Role == "kv_both" && k.SideChannelHost == "10.0.0.7" && k.SideChannelPort == 5700
			}},
		// vLLM's snapshot endpoint (spec.engine.kvEvents.snapshots): rank 0's port, the
		// simulator offsets it per rank as vLLM does.
		{shape: "snapshots", ignored: "--tensor-parallel-size",
			check: func(c vllmsim.Config) bool {
				return c.DataParallelSize == 2 && c.KVSnapshotPort == 5650 && c.KVReplayBind == "tcp://*:5600"
			}},
		// Engines dial the router's events Service: vLLM connects to an endpoint with a host.
		{shape: "bound", ignored: "--tensor-parallel-size",
			check: func(c vllmsim.Config) bool {
				return strings.HasPrefix(c.KVEventsConnect, "tcp://") && strings.Contains(c.KVEventsConnect, ".svc:") && c.KVEventsBind == ""
			}},
	} {
		t.Run(c.shape, func(t *testing.T) {
			ctr := renderedEngine(t, c.shape)
			if !reflect.DeepEqual(ctr.Command, []string{"vllm", "serve"}) {
				t.Fatalf("command %q, want vllm serve", ctr.Command)
			}
			res, err := vllmcli.Serve(vllmsim.Config{}, ctr.Args, podEnv(ctr, "10.0.0.7"))
			if err != nil {
				t.Fatalf("%q: %v", ctr.Args, err)
			}
			if !c.check(res.Config) {
				t.Errorf("from %q:\n%+v", ctr.Args, res.Config)
			}
			if got := strings.Join(res.Ignored, " "); got != c.ignored {
				t.Errorf("ignored %q, want %q", got, c.ignored)
			}
			if err := res.Config.Defaults().Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestRenderedPrefillCommand runs the prefill pool's command through the same parser: its own
// args after spec.engine's, the connector, the side channel on the pod's IP.
func TestRenderedPrefillCommand(t *testing.T) {
	b, err := os.ReadFile("../../config/samples/serving_v1alpha1_kvroutedmodel_pd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v, err := validation.New()
	if err != nil {
		t.Fatal(err)
	}
	m, err := v.Admit(context.Background(), b, "default")
	if err != nil {
		t.Fatal(err)
	}
	d, err := render.PrefillDeployment(m, render.Options{DefaultEngineImage: "vllm/vllm-openai:test"})
	if err != nil {
		t.Fatal(err)
	}
	ctr := d.Spec.Template.Spec.Containers[0]
	res, err := vllmcli.Serve(vllmsim.Config{}, ctr.Args, podEnv(ctr, "10.0.0.8"))
	if err != nil {
		t.Fatalf("%q: %v", ctr.Args, err)
	}
	c := res.Config
	if k := c.KVTransfer; k == nil || k.SideChannelHost != "10.0.0.8" || k.SideChannelPort != 5700 || c.MaxBatchedTokens != 16384 {
		t.Fatalf("from %q:\n%+v", ctr.Args, c)
	}
	if err := c.Defaults().Validate(); err != nil {
		t.Error(err)
	}
}
