package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseKeepsDefaultsAndReadsEngines(t *testing.T) {
	c, err := Parse([]byte(`
listen: 127.0.0.1:8001
policy: load
blockSize: 16
hash: {algo: xxhash, seed: "42"}
engines:
- name: e0
  url: http://127.0.0.1:8100
  events: [tcp://127.0.0.1:5557, tcp://127.0.0.1:5558]
  replay: [tcp://127.0.0.1:5600, tcp://127.0.0.1:5601]
  warmupUntil: "2026-01-01T00:00:00Z"
warmup: {duration: 90s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8001" || c.Policy != "load" || c.Hash.Seed != "42" || c.BlockSize != 16 {
		t.Errorf("explicit keys not read: %+v", c)
	}
	if c.AdminListen != Default().AdminListen || c.Warmup.Credit != 0.5 || c.Limits.MaxBodyBytes != Default().Limits.MaxBodyBytes {
		t.Errorf("defaults lost for keys the file leaves out: %+v", c)
	}
	if c.Warmup.Duration.Duration != 90*time.Second {
		t.Errorf("warmup.duration = %v, want 90s", c.Warmup.Duration)
	}
	if len(c.Engines) != 1 || len(c.Engines[0].Events) != 2 || c.Engines[0].WarmupUntil == nil ||
		!c.Engines[0].WarmupUntil.Time.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("engine not read: %+v", c.Engines)
	}
}

func TestParseFillsDiscoveryAnnotations(t *testing.T) {
	c, err := Parse([]byte("discovery:\n  kubernetes: {namespace: llm, selector: a=b, port: 8000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Discovery.Kubernetes
	if k.EventsPortsAnnotation != DefaultEventsPortsAnnotation || k.WarmupUntilAnnotation != DefaultWarmupUntilAnnotation {
		t.Errorf("annotation names not defaulted: %+v", k)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "polcy: kv\n", `unknown field "polcy"`},
		{"nested unknown key", "scoring: {loadWieght: 2}\n", `unknown field "scoring.loadWieght"`},
		{"policy", "policy: fastest\n", "policy: \"fastest\" is not one of"},
		{"seed random", "hash: {seed: random}\n", "hash.seed: \"random\" is not a decimal integer"},
		{"seed too big", "hash: {seed: \"4294967296\"}\n", "hash.seed"},
		{"seed leading zero", "hash: {seed: \"042\"}\n", "hash.seed"},
		{"algo", "hash: {algo: md5}\n", "hash.algo"},
		{"listen", "listen: localhost\n", "listen: \"localhost\" is not host:port"},
		{"engine url", "engines: [{name: a, url: 'ftp://x'}]\n", "engines[0].url"},
		{"engine event", "engines: [{name: a, url: 'http://x:1', events: ['udp://x:1']}]\n", "engines[0].events[0]"},
		{"replay count", "engines: [{name: a, url: 'http://x:1', events: ['tcp://x:1','tcp://x:2'], replay: ['tcp://x:3']}]\n", "engines[0].replay: has 1 endpoints but events has 2"},
		{"duplicate engine", "engines: [{name: a, url: 'http://x:1'}, {name: a, url: 'http://x:2'}]\n", "engines[1].name: \"a\" is listed twice"},
		{"both sources", "engines: [{name: a, url: 'http://x:1'}]\ndiscovery: {kubernetes: {namespace: llm, selector: a=b, port: 1}}\n", "not both"},
		{"empty selector", "discovery: {kubernetes: {namespace: llm, port: 1}}\n", "discovery.kubernetes.selector: required"},
		{"pool name", "discovery: {inferencePool: {namespace: llm}}\n", "discovery.inferencePool: namespace and name are both required"},
		{"pool and pods", "discovery: {inferencePool: {namespace: llm, name: p}, kubernetes: {namespace: llm, selector: a=b}}\n", "either kubernetes or inferencePool"},
		{"no source", "discovery: {}\n", "names no source (kubernetes or inferencePool)"},
		{"ext proc listen", "extProc: {conformanceHooks: true}\n", "extProc.listen: required"},
		{"listen off without the picker", "listen: \"off\"\n", "listen: \"off\" serves no API: it needs extProc.listen"},
		{"credit", "warmup: {credit: 1.5}\n", "warmup.credit"},
		{"imbalance", "scoring: {imbalanceBound: 0.5}\n", "scoring.imbalanceBound"},
		{"tier", "scoring: {tierWeights: {cpu: 2}}\n", "scoring.tierWeights.cpu"},
		{"body", "limits: {maxBodyBytes: 0}\n", "limits.maxBodyBytes"},
		{"timeout", "limits: {requestTimeout: 0s}\n", "limits.requestTimeout"},
		{"first token timeout", "limits: {firstTokenTimeout: -1s}\n", "limits.firstTokenTimeout"},
		{"body timeout", "limits: {bodyReadTimeout: 0s}\n", "limits.bodyReadTimeout"},
		{"header timeout", "limits: {headerReadTimeout: 0s}\n", "limits.headerReadTimeout"},
		{"idle timeout", "limits: {idleTimeout: 0s}\n", "limits.idleTimeout"},
		{"bad duration", "warmup: {duration: soon}\n", "router config"},
		{"engine kind", "engineKind: tgi\n", `engineKind: engine kind "tgi" is not one of vllm, sglang, trtllm`},
		{"mixed kinds", "engineKind: sglang\nengines: [{name: a, url: 'http://x:1', kind: trtllm}]\n", "engines[0].kind: trtllm differs from engineKind sglang: a fleet mixing engine kinds is refused"},
		{"render url", "renderURL: render:8100\n", `renderURL: "render:8100" is not an http(s)://host:port URL`},
		{"response owners", "responses: {maxOwners: -1}\n", "responses.maxOwners: -1 must be between 1 and 10000000 (0 or absent: 100000)"},
		{"response owners past the bound", "responses: {maxOwners: 20000000}\n", "responses.maxOwners: 20000000 must be between 1 and 10000000"},
		{"response owner ttl", "responses: {ownerTTL: -1s}\n", "responses.ownerTTL: -1s must be > 0"},
		{"split threshold", "disaggregation: {minUncachedTokens: -2}\n", "disaggregation.minUncachedTokens: -2 is below -1"},
		{"report mode on sglang", "engineKind: sglang\nkvCacheReportMode: full\n", `kvCacheReportMode: "full" needs vLLM engines; sglang engines have no report modes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%q) = %v, want an error containing %q", tc.yaml, err, tc.want)
			}
		})
	}
}

// The request-path timeouts parse; firstByteTimeout, the old name, still sets the first-token
// timeout unless firstTokenTimeout is given too.
func TestTimeouts(t *testing.T) {
	c, err := Parse([]byte("limits: {headerReadTimeout: 3s, bodyReadTimeout: 4s, firstTokenTimeout: 20m, idleTimeout: 1m, requestTimeout: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	l := c.Limits
	if l.HeaderReadTimeout.Duration != 3*time.Second || l.BodyReadTimeout.Duration != 4*time.Second ||
		l.FirstTokenTimeout.Duration != 20*time.Minute || l.IdleTimeout.Duration != time.Minute || l.RequestTimeout.Duration != time.Hour {
		t.Fatalf("limits %+v", l)
	}
	if c, err = Parse([]byte("limits: {firstByteTimeout: 2m}\n")); err != nil || c.Limits.FirstTokenTimeout.Duration != 2*time.Minute || c.Limits.FirstByteTimeout != nil {
		t.Fatalf("old name: %+v %v", c.Limits, err)
	}
	if c, err = Parse([]byte("limits: {firstByteTimeout: 2m, firstTokenTimeout: 3m}\n")); err != nil || c.Limits.FirstTokenTimeout.Duration != 3*time.Minute {
		t.Fatalf("both names: %+v %v", c.Limits, err)
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := Parse([]byte("policy: x1\nhash: {algo: z1}\n"))
	if err == nil || !strings.Contains(err.Error(), "policy:") || !strings.Contains(err.Error(), "hash.algo:") {
		t.Fatalf("want both problems reported, got %v", err)
	}
}

func TestMarshalRoundTrips(t *testing.T) {
	c := Default()
	c.Discovery = &Discovery{Kubernetes: DefaultKubernetesDiscovery("llm", "a=b", 8000)}
	c.Warmup.Credit = 0.25
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out)
	if err != nil {
		t.Fatalf("re-parse: %v\n%s", err, out)
	}
	again, _ := back.Marshal()
	if string(again) != string(out) {
		t.Errorf("round trip changed the file:\n%s\n---\n%s", out, again)
	}
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("policy: round-robin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil || c.Policy != "round-robin" {
		t.Fatalf("Load = %+v, %v", c, err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
}

// The router offers production policies only: a benchmark policy (kvbench's) is refused by
// Validate, with the key and the names it takes, and accepted by ValidatePolicies when the binary
// offers it.
func TestBenchmarkPoliciesAreNotTheRouters(t *testing.T) {
	for _, key := range []string{"policy", "shadowPolicy"} {
		c := Default()
		if key == "policy" {
			c.Policy = "prefix-char"
		} else {
			c.ShadowPolicy = "prefix-char"
		}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), key+": \"prefix-char\" is not one of") {
			t.Errorf("%s prefix-char: %v, want refused by name", key, err)
		}
		if err := c.ValidatePolicies(append(slices.Clone(Policies), "prefix-char")); err != nil {
			t.Errorf("%s prefix-char offered: %v", key, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("policy: kv\n"))
	f.Add([]byte("engines: [{name: a, url: 'http://x:1', events: ['tcp://x:1']}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("Parse accepted a config Validate refuses: %v", verr)
			}
		}
	})
}

// The engine key is read from a named variable or file, never given inline; a source that is
// named but missing or empty is an error at start, not a router that fails every engine call.
func TestEngineAuth(t *testing.T) {
	c, err := Parse([]byte("engineAuth: {apiKeyEnv: KVR_TEST_KEY}\n"))
	if err != nil || c.EngineAuth == nil || c.EngineAuth.APIKeyEnv != "KVR_TEST_KEY" {
		t.Fatalf("%+v %v", c.EngineAuth, err)
	}
	if _, err := c.EngineAuth.Key(); err == nil || !strings.Contains(err.Error(), "not set") {
		t.Errorf("unset variable: %v", err)
	}
	t.Setenv("KVR_TEST_KEY", "  ")
	if _, err := c.EngineAuth.Key(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty variable: %v", err)
	}
	t.Setenv("KVR_TEST_KEY", "s3cret\n")
	if k, err := c.EngineAuth.Key(); err != nil || k != "s3cret" {
		t.Errorf("key %q %v", k, err)
	}
	file := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, err := (EngineAuth{APIKeyFile: file}).Key(); err != nil || k != "from-file" {
		t.Errorf("file key %q %v", k, err)
	}
	if err := os.WriteFile(file, []byte("two\nlines\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (EngineAuth{APIKeyFile: file}).Key(); err == nil {
		t.Error("a two-line key was accepted")
	}
	if _, err := (EngineAuth{APIKeyFile: file + ".missing"}).Key(); err == nil {
		t.Error("a missing file was accepted")
	}
	for _, bad := range []string{
		"engineAuth: {}\n",
		"engineAuth: {apiKeyEnv: A, apiKeyFile: /k}\n",
		"engineAuth: {apiKeyEnv: 1BAD}\n",
		"engineAuth: {apiKey: inline}\n", // no inline key: the schema has no such field
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	// Absent by default, and absent from the rendered file when unset.
	out, err := Default().Marshal()
	if err != nil || strings.Contains(string(out), "engineAuth") {
		t.Errorf("default config renders engineAuth: %s %v", out, err)
	}
}

// Bound mode: events.bind is where the router binds; replay endpoints may come without event
// endpoints (the events arrive on the bound socket).
func TestEventsBindAndReplayOnly(t *testing.T) {
	c, err := Parse([]byte(`
events: {bind: "tcp://*:5557"}
engines: [{name: a, url: "http://x:1", replay: ["tcp://x:5600"]}]
`))
	if err != nil || c.Events.Bind != "tcp://*:5557" || len(c.Engines[0].Replay) != 1 {
		t.Fatalf("%+v %v", c.Events, err)
	}
	if _, err := Parse([]byte("events: {bind: \"*:5557\"}\n")); err == nil || !strings.Contains(err.Error(), "events.bind") {
		t.Errorf("a bind address without tcp:// was accepted: %v", err)
	}
	if out, _ := Default().Marshal(); strings.Contains(string(out), "bind") {
		t.Errorf("default config renders a bind address:\n%s", out)
	}
}

func TestCaptureAndAuditValidation(t *testing.T) {
	for _, tc := range []struct {
		yaml, want string
	}{
		{"capture: {enabled: true}", "capture.dir: required"},
		{"capture: {enabled: true, dir: /x, maxBytes: 10}", "capture.maxBytes: 10 is below"},
		{"capture: {enabled: true, dir: /x, files: -1}", "capture.files"},
		{"capture: {enabled: false}", ""},
		{"capture: {enabled: true, dir: /x, maxBytes: 1048576, files: 2}", ""},
		{"audit: {enabled: true, sampleEvery: -1}", "audit.sampleEvery"},
		{"audit: {enabled: true, sampleEvery: 4, showText: true}", ""},
		{"capture: {enabled: true, dir: /x, maxbytes: 1}", "unknown field"},
	} {
		_, err := Parse([]byte(tc.yaml))
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// The router reads engine pods by the annotation names the operator writes: one set of names,
// the API package's, and every default points at it.
func TestAnnotationNamesAreTheOperators(t *testing.T) {
	d := DefaultKubernetesDiscovery("ns", "app=x", 0)
	got := []string{d.EventsPortsAnnotation, d.ReplayPortsAnnotation, d.BlockSizeAnnotation, d.WarmupUntilAnnotation}
	want := []string{v1alpha1.AnnotationKVEvents, v1alpha1.AnnotationKVReplay, v1alpha1.AnnotationBlock, v1alpha1.AnnotationWarmup}
	for i := range want {
		if got[i] != want[i] || !strings.HasPrefix(got[i], v1alpha1.AnnotationPrefix) {
			t.Errorf("annotation %d: the router reads %q, the operator writes %q", i, got[i], want[i])
		}
	}
}

// responses.maxOwners and responses.ownerTTL set the response-owner map's bounds; absent, the
// defaults (100,000 ids, 24 h).
func TestResponseOwnerBounds(t *testing.T) {
	c, err := Parse([]byte("responses: {maxOwners: 5000, ownerTTL: 2h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n, ttl := c.ResponseOwnerBounds(); n != 5000 || ttl != 2*time.Hour {
		t.Fatalf("bounds %d %v", n, ttl)
	}
	d := Default()
	if n, ttl := d.ResponseOwnerBounds(); n != 100_000 || ttl != 24*time.Hour {
		t.Fatalf("default bounds %d %v", n, ttl)
	}
}

// listen: off with the picker's listener is a picker-only router.
func TestListenOffWithThePicker(t *testing.T) {
	c, err := Parse([]byte("listen: \"off\"\nextProc: {listen: ':9002'}\n"))
	if err != nil || c.Listen != ListenOff {
		t.Fatalf("Parse = %+v, %v", c, err)
	}
}
