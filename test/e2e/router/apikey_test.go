package router

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/sim/simproc"
	"github.com/kvroute/kvroute/sim/simproc/simproctest"
)

// The engine API key end to end: real vllm-sim processes started with
// an API key (from VLLM_API_KEY, as vLLM reads it, so it is in no argument list) behind a real
// kvrouter process given the key through --engine-api-key-env. Text completions (rendered by
// the engines' guarded /v1/completions/render), chat (/v1/chat/completions/render) and a LoRA
// adapter (discovered through the guarded /v1/models) go to the engine holding their prefix
// and are routed exactly — the router's prediction equals what the engine reports cached —
// with zero tokenizer failures and zero refused router calls, whatever Authorization the
// client itself sends (none, a gateway's, the engine key).
func TestAPIKeyFleetRoutesExactly(t *testing.T) {
	const key = "e2e-engine-key-7f3a"
	simBin, routerBin := testkit.Build(t, "./cmd/vllm-sim"), testkit.Build(t, "./cmd/kvrouter")
	var engines []string
	var sims []*simproc.Sim
	for i := range 3 {
		s := simproctest.Start(t, simBin, simproc.Options{Name: fmt.Sprintf("vllm-sim e%d", i), Env: []string{"VLLM_API_KEY=" + key}},
			"--lora-modules", "ad1", "--time-scale", "20", "--decode-ms-per-token", "2")
		sims = append(sims, s)
		engines = append(engines, "--engine", fmt.Sprintf("e%d=%s;events=%s;replay=%s", i, s.URL,
			strings.Join(s.Events, ","), strings.Join(s.Replay, ",")))
		if i == 0 {
			// The engines really are guarded: the render endpoint refuses a caller without it.
			if a := call(t, http.MethodPost, s.URL+"/v1/completions/render", `{"model":"vllm-sim","prompt":"x"}`, ""); a.status != 401 {
				t.Fatalf("vllm-sim without a key: %d %s", a.status, a.body)
			}
		}
	}
	router, api, admin := startRouterProc(t, routerBin, []string{"KVR_ENGINE_KEY=" + key},
		append([]string{"--engine-api-key-env", "KVR_ENGINE_KEY"}, engines...)...)
	base, adm := "http://"+api, "http://"+admin
	testkit.WaitFor(t, 20*time.Second, "every stream exact and every model read", func() bool {
		router.alive(t)
		a := call(t, http.MethodGet, adm+"/debug/engines", "", "")
		var dbg struct {
			Engines []struct {
				Model string `json:"model"`
				Ranks []struct {
					Stream string `json:"stream"`
				} `json:"ranks"`
			} `json:"engines"`
		}
		if a.status != 200 || json.Unmarshal(a.body, &dbg) != nil || len(dbg.Engines) != 3 {
			return false
		}
		for _, e := range dbg.Engines {
			if e.Model != "vllm-sim" || e.Ranks[0].Stream != "exact" {
				return false
			}
		}
		return true
	})

	// Each prefix is first served by one engine directly (with the key), then a sibling goes
	// through the router: it must land there and predict exactly what the engine reports.
	clientAuth := []string{"", "Bearer a-gateway-key", "Bearer " + key}
	n := 0
	sibling := func(what, path, warm, body string, on int) {
		t.Helper()
		if a := call(t, http.MethodPost, sims[on].URL+path, warm, "Bearer "+key); a.status != 200 {
			t.Fatalf("%s warm-up on e%d: %d %s", what, on, a.status, a.body)
		}
		var a answer
		want := fmt.Sprintf("e%d", on)
		// The engine's BlockStored reaches the router within milliseconds; the route is asked
		// again (read-only) until the router sees the warm-up, then the request is sent.
		// Chosen alone is not enough: before the events arrive every candidate scores alike and
		// the tie may fall on the wanted engine by chance, so its exact blocks must show too.
		testkit.WaitFor(t, 10*time.Second, what+" warm-up indexed", func() bool {
			router.alive(t)
			var rt struct {
				Chosen     string `json:"chosen"`
				Candidates []struct {
					Replica     string `json:"replica"`
					ExactBlocks int    `json:"exact_blocks"`
				} `json:"candidates"`
			}
			if json.Unmarshal(call(t, http.MethodPost, adm+"/debug/route", body, "").body, &rt) != nil || rt.Chosen != want+"/0" {
				return false
			}
			for _, c := range rt.Candidates {
				if c.Replica == want+"/0" {
					return c.ExactBlocks > 0
				}
			}
			return false
		})
		a = call(t, http.MethodPost, base+path, body, clientAuth[n%len(clientAuth)])
		n++
		if a.status != 200 {
			t.Fatalf("%s: %d %s", what, a.status, a.body)
		}
		var u struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(a.body, &u); err != nil {
			t.Fatalf("%s: %s: %v", what, a.body, err)
		}
		got, pred := a.header.Get("x-kvroute-engine"), a.header.Get("x-kvroute-predicted-cached-tokens")
		if got != want || u.Usage.Details.Cached == 0 || pred != strconv.Itoa(u.Usage.Details.Cached) {
			t.Fatalf("%s: routed to %s (want %s), predicted %s cached tokens, the engine reports %d; /debug/route now: %s; /debug/engines: %s", what, got, want, pred,
				u.Usage.Details.Cached, call(t, http.MethodPost, adm+"/debug/route", body, "").body, call(t, http.MethodGet, adm+"/debug/engines", "", "").body)
		}
	}
	for p := range 3 {
		prefix := strings.Repeat(fmt.Sprintf("conversation %d shares this long system prompt. ", p), 12)
		text := func(q string) string {
			b, _ := json.Marshal(map[string]any{"model": "vllm-sim", "max_tokens": 2, "prompt": prefix + q})
			return string(b)
		}
		chat := func(model, q string) string {
			b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2, "messages": []map[string]string{
				{"role": "system", "content": prefix}, {"role": "user", "content": q}}})
			return string(b)
		}
		sibling("text", "/v1/completions", text("first question"), text("a second, different question"), p%3)
		sibling("chat", "/v1/chat/completions", chat("vllm-sim", "hello"), chat("vllm-sim", "hello again, differently"), (p+1)%3)
		sibling("adapter", "/v1/chat/completions", chat("ad1", "hello"), chat("ad1", "hello again, differently"), (p+2)%3)
	}
	// The adapter's requests carry its identity: learned from the guarded /v1/models.
	if a := call(t, http.MethodPost, adm+"/debug/route", `{"model":"ad1","messages":[{"role":"user","content":"x"}]}`, ""); !bytes.Contains(a.body, []byte(`"lora":"ad1"`)) {
		t.Fatalf("debug route for the adapter: %d %s", a.status, a.body)
	}
	metrics := string(call(t, http.MethodGet, adm+"/metrics", "", "").body)
	for _, want := range []string{
		"kvroute_router_tokenize_failures_total 0",
		`kvroute_router_engine_auth_failures_total{call="tokenize"} 0`,
		`kvroute_router_engine_auth_failures_total{call="models"} 0`,
		`kvroute_router_engine_auth_failures_total{call="health"} 0`,
		`kvroute_router_engine_auth_failures_total{call="generate"} 0`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if m := regexp.MustCompile(`kvroute_router_tokenize_source_total\{source="engine"\} (\d+)`).FindStringSubmatch(metrics); m == nil || m[1] == "0" {
		t.Errorf("no render went to the engines: %v", m)
	}
	if strings.Contains(router.output(), key) {
		t.Error("the engine key appears in kvrouter's log")
	}
	t.Logf("%d requests routed exactly through guarded engines", n)
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func call(t *testing.T, method, url, body, auth string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

func TestMain(m *testing.M) { testkit.Main(m) }

// proc is a child process whose output is kept (and shown if the test fails).
type proc struct {
	name string
	done chan struct{} // closed once it has exited and its output is read
	err  error         // how it exited, set before done closes
	out  testkit.LockedBuffer
}

func (p *proc) output() string { return p.out.String() }

// startProc runs a child with extra environment and stops it (SIGTERM, then SIGKILL) when the
// test ends. Its output is drained line by line into onLine (may be nil) and kept.
func startProc(t *testing.T, name, bin string, env []string, onLine func(string), args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	p := &proc{name: name, done: make(chan struct{})}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			_, _ = p.out.Write([]byte(sc.Text() + "\n"))
			if onLine != nil {
				onLine(sc.Text())
			}
		}
	}()
	go func() {
		p.err = cmd.Wait()
		<-drained // the child's end of the pipe closed with it
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		pr.Close()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.output())
		}
	})
	return p
}

// alive fails the test at once, with the process's output, when it has exited.
func (p *proc) alive(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%s exited (%v):\n%s", p.name, p.err, p.output())
	default:
	}
}

// startRouterProc runs kvrouter on ports the kernel picks and returns once it listens, with
// the API and admin addresses its "kvrouter listening" line reports.
func startRouterProc(t *testing.T, bin string, env []string, args ...string) (p *proc, api, admin string) {
	t.Helper()
	addrs := make(chan [2]string, 1)
	var once sync.Once
	p = startProc(t, "kvrouter", bin, env, func(line string) {
		var rec struct{ Msg, API, Admin string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "kvrouter listening" {
			once.Do(func() { addrs <- [2]string{rec.API, rec.Admin} })
		}
	}, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}, args...)...)
	select {
	case a := <-addrs:
		return p, a[0], a[1]
	case <-p.done:
		t.Fatalf("kvrouter exited before listening (%v):\n%s", p.err, p.output())
	case <-time.After(30 * time.Second):
		t.Fatalf("kvrouter did not listen within 30 s:\n%s", p.output())
	}
	return nil, "", ""
}
