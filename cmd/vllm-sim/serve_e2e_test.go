package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/kvwire"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// The engine command the operator renders for the simulator sample (two DP ranks), run as is
// through a link named vllm: events come on the rendered port of each rank under the rendered
// topic, $(POD_IP) expanded from the environment, and the rendered replay port answers.
func TestRenderedEngineCommandRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds vllm-sim")
	}
	dir := t.TempDir()
	vllm := filepath.Join(dir, "vllm")
	if err := os.Symlink(testkit.Build(t, "./cmd/vllm-sim"), vllm); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../config/samples/serving_v1alpha1_kvroutedmodel_sim.yaml")
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
	// The rendered ports, moved to free ones: the engine binds them on every interface.
	taken := map[int]bool{}
	httpPort, events, replay := int32(testkit.FreeRun(t, 1, taken)), int32(testkit.FreeRun(t, 2, taken)), int32(testkit.FreeRun(t, 2, taken))
	m.Spec.Engine.Port, m.Spec.Engine.KVEvents.BasePort, m.Spec.Engine.KVEvents.ReplayBasePort = httpPort, events, &replay
	d, err := render.EngineDeployment(m, render.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if strings.Join(c.Command, " ") != "vllm serve" {
		t.Fatalf("rendered command %q", c.Command)
	}
	env := []string{"POD_IP=127.0.0.1"}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	topic := "kv@127.0.0.1@" + m.Spec.Model.Name

	// Subscribers first, so the first batch is not lost to ZMQ's slow joiner.
	subs := make([]*zmq.Socket, 2)
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

	var out testkit.LockedBuffer
	cmd := exec.Command(vllm, append(c.Command[1:], c.Args...)...)
	cmd.Args[0] = c.Command[0]
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	testkit.Eventually(t, 30*time.Second, "vllm-sim /health", func() error {
		if cmd.ProcessState != nil {
			return fmt.Errorf("exited: %s", out.String())
		}
		resp, err := http.Get(base + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	if !strings.Contains(out.String(), "ignoring vLLM flags the simulator does not model: --tensor-parallel-size\n") {
		t.Errorf("no single line naming the ignored flags in:\n%s", out.String())
	}

	// Completions until a BlockStored arrives on some rank's rendered port under the topic.
	dec := kvwire.NewDecoder()
	rank, n := -1, 0
	testkit.Eventually(t, 30*time.Second, "a BlockStored batch under "+topic, func() error {
		body, _ := json.Marshal(map[string]any{"model": m.Spec.Model.Name, "max_tokens": 2,
			"prompt": fmt.Sprintf("request %d: %s", n, strings.Repeat("the same long shared prefix ", 20))})
		n++
		resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		var res struct {
			Usage struct {
				PromptTokensDetails *struct {
					CachedTokens *int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&res)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("completion: status %d, %v", resp.StatusCode, err)
		}
		if res.Usage.PromptTokensDetails == nil || res.Usage.PromptTokensDetails.CachedTokens == nil {
			t.Fatal("usage without prompt_tokens_details.cached_tokens under --enable-prompt-tokens-details")
		}
		for r, s := range subs {
			frames, err := s.RecvMessageBytes(0)
			if err != nil {
				continue
			}
			msg, err := kvwire.ParseFrames(frames)
			if err != nil {
				t.Fatal(err)
			}
			if string(msg.Topic) != topic {
				t.Fatalf("topic %q, want %q", msg.Topic, topic)
			}
			batch, err := dec.DecodeBatch(msg.Payload)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range batch.Events {
				if e.Type == kvwire.EventBlockStored && len(e.Stored.BlockHashes) > 0 && e.Stored.BlockSize == int64(m.Spec.Engine.BlockSize) {
					rank = r
					return nil
				}
			}
		}
		return fmt.Errorf("no BlockStored yet")
	})

	// That rank's rendered replay port answers with what it published, then the end marker.
	dealer, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	defer dealer.Close()
	_ = dealer.SetLinger(0)
	_ = dealer.SetRcvtimeo(10 * time.Second)
	if err := dealer.Connect(fmt.Sprintf("tcp://127.0.0.1:%d", int(replay)+rank)); err != nil {
		t.Fatal(err)
	}
	if _, err := dealer.SendMessage(kvwire.ReplayRequest(0)); err != nil {
		t.Fatal(err)
	}
	batches := 0
	for {
		frames, err := dealer.RecvMessageBytes(0)
		if err != nil {
			t.Fatalf("replay on rank %d after %d batches: %v", rank, batches, err)
		}
		msg, end, err := kvwire.ParseReplayReply(frames)
		if err != nil {
			t.Fatal(err)
		}
		if end {
			break
		}
		if string(msg.Topic) != topic {
			t.Fatalf("replayed topic %q, want %q", msg.Topic, topic)
		}
		batches++
	}
	if batches == 0 {
		t.Errorf("replay on rank %d answered with no batch", rank)
	}
}

// The rendered SGLang and TensorRT-LLM engine commands, run as the image runs them: SGLang's
// through a link named python3, TensorRT-LLM's through a link named trtllm-serve reading the
// --config file the kubelet projects from the pod annotation (written here where the volume
// would be). Neither needs a shell, so both run on the hermetic image (hack/images.sh), which
// has none: each command's program is one of Dockerfile.vllm-sim's links.
func TestRenderedOtherEngineCommandsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds vllm-sim")
	}
	df, err := os.ReadFile("../../Dockerfile.vllm-sim")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := testkit.Build(t, "./cmd/vllm-sim")
	for _, l := range []string{"python3", "trtllm-serve"} {
		if err := os.Symlink(bin, filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	v, err := validation.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, shape := range []string{"sglang", "trtllm"} {
		t.Run(shape, func(t *testing.T) {
			b, err := os.ReadFile("../../config/samples/serving_v1alpha1_kvroutedmodel_" + shape + ".yaml")
			if err != nil {
				t.Fatal(err)
			}
			m, err := v.Admit(context.Background(), b, "default")
			if err != nil {
				t.Fatal(err)
			}
			taken := map[int]bool{}
			httpPort, events, replay := int32(testkit.FreeRun(t, 1, taken)), int32(testkit.FreeRun(t, 2, taken)), int32(testkit.FreeRun(t, 2, taken))
			m.Spec.Engine.Port, m.Spec.Engine.KVEvents.BasePort, m.Spec.Engine.KVEvents.ReplayBasePort = httpPort, events, &replay
			d, err := render.EngineDeployment(m, render.Options{})
			if err != nil {
				t.Fatal(err)
			}
			c := d.Spec.Template.Spec.Containers[0]
			if !strings.Contains(string(df), "RUN ln -s vllm-sim /usr/local/bin/"+c.Command[0]+"\n") {
				t.Fatalf("command %q: its program is not a link of Dockerfile.vllm-sim (the hermetic image has no shell)", c.Command)
			}
			cfgPath := filepath.Join(t.TempDir(), "config.yaml")
			if cfg := d.Spec.Template.Annotations[v1alpha1.AnnotationEngineConfig]; cfg != "" {
				if err := os.WriteFile(cfgPath, []byte(cfg), 0o444); err != nil {
					t.Fatal(err)
				}
			}
			env := []string{"POD_IP=127.0.0.1", "PATH=" + dir + ":" + os.Getenv("PATH")}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					// The kubelet expands $(POD_IP) in the config variable.
					env = append(env, e.Name+"="+strings.ReplaceAll(e.Value, "$(POD_IP)", "127.0.0.1"))
				}
			}
			var cmd *exec.Cmd
			switch shape {
			case "sglang":
				cmd = exec.Command(filepath.Join(dir, "python3"), append(c.Command[1:], c.Args...)...)
				cmd.Args[0] = c.Command[0]
			case "trtllm":
				args := slices.Clone(c.Args)
				for i := range args {
					args[i] = strings.ReplaceAll(args[i], render.TRTLLMConfigPath, cfgPath)
				}
				cmd = exec.Command(filepath.Join(dir, c.Command[0]), args...)
				cmd.Args[0] = c.Command[0]
			}
			var out testkit.LockedBuffer
			cmd.Env = append(os.Environ(), env...)
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
			testkit.Eventually(t, 30*time.Second, "vllm-sim /health", func() error {
				if cmd.ProcessState != nil {
					return fmt.Errorf("exited: %s", out.String())
				}
				resp, err := http.Get(base + "/health")
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %d", resp.StatusCode)
				}
				return nil
			})
			if !strings.Contains(out.String(), "vllm-sim: serving ") || !strings.Contains(out.String(), "events [tcp://") {
				t.Errorf("no serving line with event endpoints in:\n%s", out.String())
			}
			if topic := d.Spec.Template.Annotations[v1alpha1.AnnotationKVTopic]; shape == "trtllm" &&
				(topic == "" || !strings.Contains(out.String(), fmt.Sprintf("topic %q", topic))) {
				t.Errorf("the engine does not publish the topic its pods announce (%q):\n%s", topic, out.String())
			}
			// Clients (and the router) name the spec's model. trtllm-serve has no served-name
			// option: its /v1/models lists MODEL, and it answers under whatever name is asked.
			served := m.Spec.Model.Name
			if shape == "trtllm" {
				served = strings.TrimPrefix(m.Spec.Model.URI, "hf://")
			}
			resp, err := http.Get(base + "/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			var ml struct {
				Data []struct {
					ID string `json:"id"`
				} `json:"data"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&ml)
			resp.Body.Close()
			if len(ml.Data) == 0 || ml.Data[0].ID != served {
				t.Errorf("/v1/models %+v, want %q", ml.Data, served)
			}
			body, _ := json.Marshal(map[string]any{"model": m.Spec.Model.Name, "max_tokens": 2, "prompt": "hello there"})
			resp, err = http.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			var answer struct {
				Model string `json:"model"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&answer)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || answer.Model != m.Spec.Model.Name {
				t.Errorf("completion naming %q: status %d, model %q", m.Spec.Model.Name, resp.StatusCode, answer.Model)
			}
		})
	}
}
