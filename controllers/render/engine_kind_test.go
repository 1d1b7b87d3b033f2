package render_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/controllers/render"
)

func engineContainer(t *testing.T, m *v1alpha1.KVRoutedModel, opts render.Options) corev1.Container {
	t.Helper()
	d, err := render.EngineDeployment(m, opts)
	if err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Spec.Containers[0]
}

func argAfter(args []string, flag string) (string, bool) {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		return "", false
	}
	return args[i+1], true
}

// Each kind runs its own server with its own spelling of the settings the operator owns, its
// own probes and image; the pod-level contract (ports per DP rank, block size) is the same.
func TestEngineKindsRenderTheirOwnServer(t *testing.T) {
	for _, c := range []struct {
		shape, kind, container, image, metrics string
		command                                []string
		flags                                  map[string]string // flag -> value
	}{
		{shape: "dp2tp2", kind: "vllm", container: "vllm", image: render.DefaultEngineImage, metrics: "",
			command: []string{"vllm", "serve"},
			flags:   map[string]string{"--port": "8000", "--block-size": "32", "--data-parallel-size": "2", "--tensor-parallel-size": "2", "--served-model-name": "llama-3-70b"}},
		{shape: "sglang", kind: "sglang", container: "sglang", image: render.SGLangImage + ":" + render.TestedSGLangReleases[0], metrics: "",
			command: []string{"python3", "-m", "sglang.launch_server"},
			flags:   map[string]string{"--model-path": "Qwen/Qwen3-8B", "--served-model-name": "qwen3-8b", "--host": "0.0.0.0", "--port": "8000", "--tp-size": "1", "--dp-size": "2", "--page-size": "16"}},
		{shape: "trtllm", kind: "trtllm", container: "trtllm", image: render.TRTLLMImage + ":" + render.TestedTRTLLMReleases[0], metrics: "/prometheus/metrics",
			command: []string{"trtllm-serve"},
			flags:   map[string]string{"--host": "0.0.0.0", "--port": "8000", "--tp_size": "2", "--backend": "pytorch", "--config": render.TRTLLMConfigPath}},
	} {
		t.Run(c.kind, func(t *testing.T) {
			m := sample(t, c.shape)
			if got := render.EngineKind(m); got != c.kind {
				t.Fatalf("kind %q", got)
			}
			// The operator's --default-engine-image is a vLLM image: other kinds keep their pin.
			ctr := engineContainer(t, m, render.Options{DefaultEngineImage: "vllm/vllm-openai:v0.26.0"})
			if ctr.Name != c.container || ctr.Image != c.image {
				t.Errorf("container %s image %s, want %s %s", ctr.Name, ctr.Image, c.container, c.image)
			}
			if !slices.Equal(ctr.Command[:len(c.command)], c.command) {
				t.Errorf("command %q, want %q...", ctr.Command, c.command)
			}
			for f, want := range c.flags {
				if got, ok := argAfter(ctr.Args, f); !ok || got != want {
					t.Errorf("%s = %q (present %v), want %q in %q", f, got, ok, want, ctr.Args)
				}
			}
			if ctr.ReadinessProbe.HTTPGet.Path != "/health" || ctr.StartupProbe.HTTPGet.Path != "/health" {
				t.Errorf("probes %s", ctr.ReadinessProbe.HTTPGet.Path)
			}
			a := render.EnginePodAnnotations(m)
			if a[v1alpha1.AnnotationKVEvents] != "5557,5558" || a[v1alpha1.AnnotationKVReplay] != "5600,5601" {
				t.Errorf("event ports %v", a)
			}
			if got := a[v1alpha1.AnnotationMetricsPath]; got != c.metrics {
				t.Errorf("metrics-path annotation %q, want %q", got, c.metrics)
			}
			wantKind := c.kind
			if c.kind == "vllm" {
				wantKind = "" // a vLLM pod's template is what it was before kinds existed
			}
			if got := a[v1alpha1.AnnotationEngineKind]; got != wantKind {
				t.Errorf("engine-kind annotation %q, want %q", got, wantKind)
			}
			// The router is told the kind (kvrouter --engine-kind) for every kind but vLLM, its
			// default, whose router pod is what it was before kinds existed.
			rd, err := render.RouterDeployment(m, testOpts)
			if err != nil {
				t.Fatal(err)
			}
			rargs := rd.Spec.Template.Spec.Containers[0].Args
			if got, ok := argAfter(rargs, "--engine-kind"); ok != (c.kind != "vllm") || (ok && got != c.kind) {
				t.Errorf("router args %q, want --engine-kind %s (none for vllm)", rargs, c.kind)
			}
			// The user's args come last, unchanged.
			if n := len(m.Spec.Engine.Args); n > 0 && string(m.Spec.Engine.Args[n-1]) != ctr.Args[len(ctr.Args)-1] {
				t.Errorf("user args not last: %q", ctr.Args)
			}
		})
	}
}

// SGLang's --kv-events-config carries the switch newer SGLang needs (enable_kv_cache_events), the
// keys its publisher takes, the topic the router subscribes to, and rank 0's ports (SGLang adds
// the DP rank).
func TestSGLangKVEventsConfig(t *testing.T) {
	m := sample(t, "sglang")
	ctr := engineContainer(t, m, testOpts)
	raw, ok := argAfter(ctr.Args, "--kv-events-config")
	if !ok {
		t.Fatalf("no --kv-events-config in %q", ctr.Args)
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600",
		"topic": "kv@$(POD_IP)@qwen3-8b", "hwm": 100000.0, "buffer_steps": 10000.0}
	if len(cfg) != len(want) {
		t.Errorf("keys %v, want %v", cfg, want)
	}
	for k, v := range want {
		if cfg[k] != v {
			t.Errorf("%s = %v, want %v", k, cfg[k], v)
		}
	}
	for _, f := range []string{"--enable-metrics", "--enable-cache-report"} {
		if !slices.Contains(ctr.Args, f) {
			t.Errorf("%s missing from %q", f, ctr.Args)
		}
	}

	// Events off: no flag at all (SGLang publishes whenever it is given).
	off := sample(t, "sglang")
	off.Spec.Engine.KVEvents.Enabled = ptrTo(false)
	if args, _ := render.EngineArgs(off); slices.Contains(args, "--kv-events-config") {
		t.Errorf("events off still renders --kv-events-config: %q", args)
	}
	// EnginesConnect: SGLang connects to an endpoint with a host.
	bound := sample(t, "sglang")
	bound.Spec.Engine.KVEvents.Mode = v1alpha1.EventsEnginesConnect
	bound.Spec.Engine.Parallelism.DataLocal = 1
	args, _ := render.EngineArgs(bound)
	raw, _ = argAfter(args, "--kv-events-config")
	if !strings.Contains(raw, `"endpoint":"tcp://qwen-sglang-events.llm.svc:5557"`) {
		t.Errorf("EnginesConnect endpoint in %s", raw)
	}
	// LoRA adapters go to --lora-paths NAME=PATH.
	lora := sample(t, "sglang")
	lora.Spec.Engine.LoRAAdapters = []v1alpha1.LoRAAdapter{{Name: "sql", URI: "hf://org/sql-lora"}}
	args, _ = render.EngineArgs(lora)
	if v, _ := argAfter(args, "--lora-paths"); v != "sql=org/sql-lora" || !slices.Contains(args, "--enable-lora") {
		t.Errorf("LoRA args %q", args)
	}
}

// TensorRT-LLM's config reaches the server as a file the kubelet projects from a pod
// annotation (a downward API volume mounted read-only), so the container runs trtllm-serve
// itself, no shell; the config turns on block reuse, the block size, the V2 manager and its
// publisher, and attention DP for several DP ranks. Its topic is the model's, shared by every
// pod, and the pods say so to the router's discovery.
func TestTRTLLMConfig(t *testing.T) {
	m := sample(t, "trtllm")
	d, err := render.EngineDeployment(m, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := d.Spec.Template
	ctr := tmpl.Spec.Containers[0]
	if !slices.Equal(ctr.Command, []string{"trtllm-serve"}) {
		t.Fatalf("command %q: want trtllm-serve itself (no shell)", ctr.Command)
	}
	if ctr.Args[0] != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Errorf("model %q first", ctr.Args[0])
	}
	if v, _ := argAfter(ctr.Args, "--config"); v != render.TRTLLMConfigPath {
		t.Errorf("--config %q, want %s", v, render.TRTLLMConfigPath)
	}
	for _, e := range ctr.Env {
		if strings.Contains(e.Value, "kv_cache_config") {
			t.Errorf("config still passed in variable %s", e.Name)
		}
	}
	raw := tmpl.Annotations[v1alpha1.AnnotationEngineConfig]
	var vol *corev1.Volume
	for i := range tmpl.Spec.Volumes {
		if tmpl.Spec.Volumes[i].DownwardAPI != nil {
			vol = &tmpl.Spec.Volumes[i]
		}
	}
	if vol == nil || len(vol.DownwardAPI.Items) != 1 ||
		vol.DownwardAPI.Items[0].FieldRef.FieldPath != "metadata.annotations['"+v1alpha1.AnnotationEngineConfig+"']" {
		t.Fatalf("no downward API volume projecting the config annotation: %+v", tmpl.Spec.Volumes)
	}
	mounted := false
	for _, vm := range ctr.VolumeMounts {
		if vm.Name == vol.Name && vm.ReadOnly && vm.MountPath+"/"+vol.DownwardAPI.Items[0].Path == render.TRTLLMConfigPath {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("config volume not mounted read-only at %s: %+v", render.TRTLLMConfigPath, ctr.VolumeMounts)
	}
	if got := tmpl.Annotations[v1alpha1.AnnotationKVTopic]; got != "kv@"+render.EngineName(m)+"@llama-3-8b" {
		t.Errorf("topic annotation %q", got)
	}
	var cfg struct {
		EnableAttentionDP bool `json:"enable_attention_dp"`
		KV                struct {
			Reuse    bool `json:"enable_block_reuse"`
			Tokens   int  `json:"tokens_per_block"`
			V2       bool `json:"use_kv_cache_manager_v2"`
			EventBuf int  `json:"event_buffer_max_size"`
			Events   *struct {
				Enable    bool   `json:"enable_kv_cache_events"`
				Publisher string `json:"publisher"`
				Endpoint  string `json:"endpoint"`
				Replay    string `json:"replay_endpoint"`
				Topic     string `json:"topic"`
			} `json:"kv_events_config"`
		} `json:"kv_cache_config"`
	}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("%v in %q", err, raw)
	}
	ev := cfg.KV.Events
	if !cfg.EnableAttentionDP || !cfg.KV.Reuse || cfg.KV.Tokens != 32 || !cfg.KV.V2 || cfg.KV.EventBuf <= 0 || ev == nil ||
		!ev.Enable || ev.Publisher != "zmq" || ev.Endpoint != "tcp://*:5557" || ev.Replay != "tcp://*:5600" || ev.Topic != tmpl.Annotations[v1alpha1.AnnotationKVTopic] {
		t.Errorf("config %s", raw)
	}

	// A user annotation of the same name does not replace the operator's config.
	m.Spec.Engine.Pod.Annotations = map[string]string{v1alpha1.AnnotationEngineConfig: "{}"}
	d, _ = render.EngineDeployment(m, testOpts)
	if d.Spec.Template.Annotations[v1alpha1.AnnotationEngineConfig] != raw {
		t.Error("the user's annotation replaced the operator's config")
	}

	// One DP rank: tensor parallelism as asked, no attention DP; events off: no publisher.
	one := sample(t, "trtllm")
	one.Spec.Engine.Parallelism.DataLocal, one.Spec.Engine.Parallelism.Tensor = 1, 4
	one.Spec.Engine.KVEvents.Enabled = ptrTo(false)
	args, _ := render.EngineArgs(one)
	if v, _ := argAfter(args, "--tp_size"); v != "4" {
		t.Errorf("--tp_size %q", v)
	}
	raw, _ = render.TRTLLMConfigJSON(one)
	if strings.Contains(raw, "enable_attention_dp") || strings.Contains(raw, "kv_events_config") || !strings.Contains(raw, `"enable_block_reuse":true`) {
		t.Errorf("config %s", raw)
	}
}

func TestCheckEngineArgsPerKind(t *testing.T) {
	for _, c := range []struct {
		kind string
		args []string
		want map[int]string
	}{
		{kind: "sglang", args: []string{"--mem-fraction-static", "0.8", "--chunked-prefill-size=4096", "--enable-torch-compile", "--no-lora-strict-loading"}},
		{kind: "sglang", args: []string{"--mem-fraction-statc", "0.8"}, want: map[int]string{0: "--mem-fraction-static"}},
		// SGLang's argparse takes dashes only.
		{kind: "sglang", args: []string{"--mem_fraction_static", "0.8"}, want: map[int]string{0: "--mem-fraction-static"}},
		// vLLM's flag is not SGLang's.
		{kind: "sglang", args: []string{"--gpu-memory-utilization", "0.9"}, want: map[int]string{0: ""}},
		{kind: "trtllm", args: []string{"--max_seq_len", "4096", "--kv_cache_free_gpu_memory_fraction=0.8", "--trust_remote_code"}},
		// click takes the names as declared: underscores.
		{kind: "trtllm", args: []string{"--max-seq-len", "4096"}, want: map[int]string{0: "--max_seq_len"}},
		// vLLM's parser takes either; TensorRT-LLM's spelling of a vLLM-only idea is unknown there.
		{kind: "vllm", args: []string{"--max_model_len", "4096"}},
		{kind: "vllm", args: []string{"--tp_size", "2"}, want: map[int]string{0: ""}},
	} {
		got := render.CheckEngineArgsFor(c.kind, c.args)
		if len(got) != len(c.want) {
			t.Errorf("%s %q: %v, want %v", c.kind, c.args, got, c.want)
			continue
		}
		for _, w := range got {
			if s, ok := c.want[w.Index]; !ok || s != w.Suggestion {
				t.Errorf("%s %q: %+v, want %v", c.kind, c.args, w, c.want)
			}
		}
	}
	w := render.CheckEngineArgsFor("trtllm", []string{"--max-seq-len"})
	if msg := w[0].String(); !strings.Contains(msg, "trtllm-serve") || !strings.Contains(msg, render.TestedTRTLLMReleases[0]) {
		t.Errorf("warning %q names neither the server nor its release", msg)
	}
}

func TestEngineImageTestedPerKind(t *testing.T) {
	sg := render.SGLangImage + ":" + render.TestedSGLangReleases[0]
	trt := render.TRTLLMImage + ":" + render.TestedTRTLLMReleases[0]
	for _, c := range []struct {
		kind, image string
		want        bool
	}{
		{"sglang", sg, true},
		{"sglang", "docker.io/" + sg, true},
		{"sglang", render.SGLangImage + ":latest", false},
		{"sglang", render.DefaultEngineImage, false}, // a vLLM image under kind sglang
		{"trtllm", trt, true},
		{"trtllm", render.TRTLLMImage + ":0.20.0", false},
		{"trtllm", "ghcr.io/kvroute/vllm-sim:v0.1.0", true}, // the simulator speaks every kind
		{"vllm", sg, false},
		{"vllm", render.DefaultEngineImage, true},
	} {
		if got, _ := render.EngineImageTestedFor(c.kind, c.image); got != c.want {
			t.Errorf("EngineImageTestedFor(%s, %s) = %v, want %v", c.kind, c.image, got, c.want)
		}
	}
	for _, k := range render.EngineKinds() {
		img := render.DefaultImageFor(k, render.DefaultEngineImage)
		if ok, _ := render.EngineImageTestedFor(k, img); !ok || strings.Contains(img, "latest") {
			t.Errorf("default image %s of %s is not a pinned tested release", img, k)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// docs/install.md's engine-kinds table is EngineKindRows, row for row.
func TestEngineKindsTableIsCurrent(t *testing.T) {
	b, err := os.ReadFile("../../docs/install.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	begin, end := strings.Index(doc, "<!-- engine-kinds:"), strings.Index(doc, "<!-- /engine-kinds -->")
	if begin < 0 || end < begin {
		t.Fatal("docs/install.md lacks the <!-- engine-kinds --> table")
	}
	var rows, want []string
	for _, l := range strings.Split(doc[begin:end], "\n") {
		if strings.HasPrefix(l, "| `") {
			rows = append(rows, l)
		}
	}
	for _, r := range render.EngineKindRows() {
		want = append(want, r.String())
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("docs/install.md engine-kinds rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
}
