package vllmcli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/engine"
	"github.com/kvroute/kvroute/router/kvwire"
	"github.com/kvroute/kvroute/sim/vllmcli"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// admitSample admits config/samples/serving_v1alpha1_kvroutedmodel_<shape>.yaml through the CRD.
func admitSample(t *testing.T, shape string) *v1alpha1.KVRoutedModel {
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
	return m
}

func engineTemplate(t *testing.T, m *v1alpha1.KVRoutedModel) corev1.PodTemplateSpec {
	t.Helper()
	d, err := render.EngineDeployment(m, render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template
}

func engineContainer(t *testing.T, m *v1alpha1.KVRoutedModel) corev1.Container {
	t.Helper()
	return engineTemplate(t, m).Spec.Containers[0]
}

// parseRendered reads a rendered SGLang or TensorRT-LLM engine as the image's links do:
// `python3 -m sglang.launch_server ARGS`, or `trtllm-serve ARGS` reading the --config file the
// kubelet projects from the pod annotation (a downward API volume).
func parseRendered(t *testing.T, tmpl corev1.PodTemplateSpec, env func(string) (string, bool)) (vllmcli.Result, error) {
	t.Helper()
	c := tmpl.Spec.Containers[0]
	switch {
	case reflect.DeepEqual(c.Command, []string{"python3", "-m", vllmcli.SGLangModule}):
		return vllmcli.SGLang(vllmsim.Config{}, c.Args, env)
	case reflect.DeepEqual(c.Command, []string{"trtllm-serve"}):
		raw, ok := tmpl.Annotations[v1alpha1.AnnotationEngineConfig]
		if !ok {
			t.Fatalf("no %s annotation to project", v1alpha1.AnnotationEngineConfig)
		}
		return vllmcli.TRTLLM(vllmsim.Config{}, c.Args, env, func(p string) ([]byte, error) {
			if p != render.TRTLLMConfigPath {
				return nil, fmt.Errorf("open %s: no such file", p)
			}
			return []byte(raw), nil // the kubelet writes the annotation as is: no $(VAR) expansion
		})
	}
	t.Fatalf("command %q is neither SGLang's nor trtllm-serve's", c.Command)
	return vllmcli.Result{}, nil
}

// The operator's rendered SGLang and TensorRT-LLM engines (the samples behind
// testdata/render/sglang.yaml and trtllm.yaml) read onto the simulator: the engine kind, the
// block size, the DP ranks, the ports and the event endpoints land where the sim uses them.
func TestRenderedOtherEngineCommands(t *testing.T) {
	for _, c := range []struct {
		shape, kind, ignored string
		check                func(vllmsim.Config) bool
	}{
		{shape: "sglang", kind: vllmsim.KindSGLang, ignored: "--tp-size --mem-fraction-static",
			check: func(c vllmsim.Config) bool {
				return c.Model == "qwen3-8b" && c.Host == "0.0.0.0" && c.Port == 8000 && c.BlockSize == 16 && c.DataParallelSize == 2 &&
					c.MaxModelLen == 32768 && c.KVEventsBind == "tcp://*:5557" && c.KVReplayBind == "tcp://*:5600" &&
					*c.KVEventsTopic == "kv@10.0.0.7@qwen3-8b" && c.HWM == 100000 && c.BufferSteps == 10000 && !c.OmitPromptTokensDetails
			}},
		{shape: "trtllm", kind: vllmsim.KindTRTLLM,
			ignored: "--backend --kv_cache_free_gpu_memory_fraction config.kv_cache_config.event_buffer_max_size config.kv_cache_config.use_kv_cache_manager_v2",
			check: func(c vllmsim.Config) bool {
				return c.Model == "meta-llama/Llama-3.1-8B-Instruct" && c.Host == "0.0.0.0" && c.Port == 8000 && c.BlockSize == 32 &&
					c.DataParallelSize == 2 && c.MaxModelLen == 32768 && c.KVEventsBind == "tcp://*:5557" && c.KVReplayBind == "tcp://*:5600" &&
					*c.KVEventsTopic == "kv@llama-trtllm-engine@llama-3-8b" && c.HWM == 100000 && c.BufferSteps == 10000 && !c.OmitPromptTokensDetails
			}},
	} {
		t.Run(c.shape, func(t *testing.T) {
			tmpl := engineTemplate(t, admitSample(t, c.shape))
			ctr := tmpl.Spec.Containers[0]
			res, err := parseRendered(t, tmpl, podEnv(ctr, "10.0.0.7"))
			if err != nil {
				t.Fatalf("%q %q: %v", ctr.Command, ctr.Args, err)
			}
			if res.Config.EngineKind != c.kind {
				t.Errorf("engine kind %q, want %q", res.Config.EngineKind, c.kind)
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

// SGLang with spec.engine.apiKeySecretRef: the rendered --api-key $(VLLM_API_KEY) names the
// Secret-backed variable, which the kubelet expands; the simulator then guards its routes with
// the Secret's key, not the literal reference.
func TestRenderedSGLangAPIKey(t *testing.T) {
	m := admitSample(t, "sglang")
	m.Spec.Engine.APIKeySecretRef = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "k"}, Key: "key"}
	tmpl := engineTemplate(t, m)
	ctr := tmpl.Spec.Containers[0]
	for _, a := range ctr.Args {
		if a == "secret" {
			t.Fatal("the key itself is in the pod spec's args")
		}
	}
	res, err := parseRendered(t, tmpl, podEnv(ctr, "10.0.0.7"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Config.APIKeys, []string{"secret"}) {
		t.Errorf("API keys %q from %q: want the Secret's value", res.Config.APIKeys, ctr.Args)
	}
}

// Options each engine does not have, or whose effect the simulator cannot give, are refused
// with the option named, as for vLLM.
func TestOtherEngineCommandsRefused(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, c := range []struct {
		name string
		run  func() error
		want string
	}{
		{"sglang unknown", func() error {
			_, err := vllmcli.SGLang(vllmsim.Config{}, []string{"--model-path", "m", "--page_size", "16"}, none)
			return err
		}, "--page_size: not an option of `python3 -m sglang.launch_server` (did you mean --page-size?)"},
		{"sglang radix off", func() error {
			_, err := vllmcli.SGLang(vllmsim.Config{}, []string{"--model-path", "m", "--disable-radix-cache"}, none)
			return err
		}, "--disable-radix-cache: vllm-sim does not simulate this SGLang option"},
		{"sglang positional", func() error {
			_, err := vllmcli.SGLang(vllmsim.Config{}, []string{"m"}, none)
			return err
		}, "takes no positional arguments"},
		{"sglang events key", func() error {
			_, err := vllmcli.SGLang(vllmsim.Config{}, []string{"--model-path", "m", "--kv-events-config", `{"publisher":"zmq","bogus":1}`}, none)
			return err
		}, `unknown field "bogus"`},
		{"trtllm unknown", func() error {
			_, err := vllmcli.TRTLLM(vllmsim.Config{}, []string{"m", "--tp-size", "2"}, none, os.ReadFile)
			return err
		}, "--tp-size: not an option of `trtllm-serve` (did you mean --tp_size?)"},
		{"trtllm block reuse off", func() error {
			_, err := vllmcli.TRTLLM(vllmsim.Config{}, []string{"m", "--config", "c.yaml"}, none, func(string) ([]byte, error) {
				return []byte("kv_cache_config:\n  enable_block_reuse: false\n"), nil
			})
			return err
		}, "enable_block_reuse false: vllm-sim always caches prefixes"},
		{"trtllm role", func() error {
			_, err := vllmcli.TRTLLM(vllmsim.Config{}, []string{"m", "--server_role", "context"}, none, os.ReadFile)
			return err
		}, "--server_role: vllm-sim does not simulate this trtllm-serve option"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.run()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// A simulator started from each rendered command (its ports moved to free ones on 127.0.0.1)
// serves a completion and publishes the engine's event wire under the rendered topic on the
// rendered port of some rank.
func TestRenderedOtherEngineRuns(t *testing.T) {
	for _, shape := range []string{"sglang", "trtllm"} {
		t.Run(shape, func(t *testing.T) {
			m := admitSample(t, shape)
			taken := map[int]bool{}
			httpPort, events, replay := int32(testkit.FreeRun(t, 1, taken)), int32(testkit.FreeRun(t, 2, taken)), int32(testkit.FreeRun(t, 2, taken))
			m.Spec.Engine.Port, m.Spec.Engine.KVEvents.BasePort, m.Spec.Engine.KVEvents.ReplayBasePort = httpPort, events, &replay
			tmpl := engineTemplate(t, m)
			ctr := tmpl.Spec.Containers[0]
			pod := podEnv(ctr, "127.0.0.1")
			env := func(k string) (string, bool) {
				if k == vllmcli.WildcardHostEnv {
					return "127.0.0.1", true
				}
				return pod(k)
			}
			res, err := parseRendered(t, tmpl, env)
			if err != nil {
				t.Fatal(err)
			}
			topic := "kv@127.0.0.1@" + m.Spec.Model.Name
			if tp := tmpl.Annotations[v1alpha1.AnnotationKVTopic]; tp != "" {
				topic = tp // TensorRT-LLM's, the same for every pod
			}
			subs := make([]*zmq.Socket, res.Config.DataParallelSize)
			for r := range subs {
				s, err := zmq.NewSocket(zmq.SUB)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				_ = s.SetLinger(0)
				_ = s.SetRcvtimeo(100 * time.Millisecond)
				if err := s.SetSubscribe(topic); err != nil {
					t.Fatal(err)
				}
				if err := s.Connect(fmt.Sprintf("tcp://127.0.0.1:%d", int(events)+r)); err != nil {
					t.Fatal(err)
				}
				subs[r] = s
			}
			sim, err := vllmsim.New(res.Config)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := sim.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			if got, want := sim.Addr(), fmt.Sprintf("127.0.0.1:%d", httpPort); got != want {
				t.Fatalf("serving on %s, want the rendered port on %s", got, want)
			}
			dec := kvwire.NewDecoderFor(engine.Kind(shape))
			n := 0
			testkit.Eventually(t, 30*time.Second, "a BlockStored batch under "+topic, func() error {
				body, _ := json.Marshal(map[string]any{"model": res.Config.Model, "max_tokens": 2,
					"prompt": fmt.Sprintf("request %d: %s", n, strings.Repeat("the same long shared prefix ", 20))})
				n++
				resp, err := http.Post("http://"+sim.Addr()+"/v1/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("completion: status %d", resp.StatusCode)
				}
				for _, s := range subs {
					frames, err := s.RecvMessageBytes(0)
					if err != nil {
						continue
					}
					msg, err := kvwire.ParseFrames(frames)
					if err != nil {
						t.Fatal(err)
					}
					batch, err := dec.DecodeBatch(msg.Payload)
					if err != nil {
						t.Fatalf("%s batch: %v", shape, err)
					}
					for _, e := range batch.Events {
						if e.Type == kvwire.EventBlockStored && len(e.Stored.BlockHashes) > 0 && e.Stored.BlockSize == int64(m.Spec.Engine.BlockSize) {
							return nil
						}
					}
				}
				return fmt.Errorf("no BlockStored yet")
			})
		})
	}
}

// Each engine's publisher switch, as its source reads it: SGLang (the pinned reading) publishes
// on publisher zmq unless enable_kv_cache_events is false; TensorRT-LLM only with it true, and
// always binds, even an endpoint with a host.
func TestOtherEnginePublisherSwitch(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for _, c := range []struct {
		name, events  string
		trt           bool
		bind, connect string
	}{
		{"sglang zmq", `{"publisher":"zmq","endpoint":"tcp://*:6000"}`, false, "tcp://*:6000", ""},
		{"sglang enabled", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000"}`, false, "tcp://*:6000", ""},
		{"sglang disabled", `{"enable_kv_cache_events":false,"publisher":"zmq"}`, false, "", ""},
		{"sglang null", `{"endpoint":"tcp://*:6000"}`, false, "", ""},
		{"sglang dials", `{"publisher":"zmq","endpoint":"tcp://router:6000"}`, false, "", "tcp://router:6000"},
		{"trtllm enabled", `{"enable_kv_cache_events":true,"endpoint":"tcp://10.0.0.1:6000"}`, true, "tcp://10.0.0.1:6000", ""},
		{"trtllm not enabled", `{"publisher":"zmq","endpoint":"tcp://*:6000"}`, true, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var res vllmcli.Result
			var err error
			if c.trt {
				res, err = vllmcli.TRTLLM(vllmsim.Config{}, []string{"m", "--config", "c.yaml"}, none, func(string) ([]byte, error) {
					return []byte(`{"kv_cache_config":{"kv_events_config":` + c.events + `}}`), nil
				})
			} else {
				res, err = vllmcli.SGLang(vllmsim.Config{}, []string{"--model-path", "m", "--kv-events-config", c.events}, none)
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Config.KVEventsBind != c.bind || res.Config.KVEventsConnect != c.connect {
				t.Errorf("bind %q connect %q, want %q %q", res.Config.KVEventsBind, res.Config.KVEventsConnect, c.bind, c.connect)
			}
		})
	}
}
