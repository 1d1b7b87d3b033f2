package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/capture"
	"github.com/kvroute/kvroute/sim/fleet"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// A chat workload that stamps the time at the start of its system prompt, through kvrouter in
// front of a vllm-sim engine under round-robin: the capture writes a trace kvbench reads, with
// output lengths from the engine's usage, and the audit names the stamped span from the
// engine's /detokenize, showing no text.
func TestCaptureAndAuditThroughTheRouter(t *testing.T) {
	sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, TimeScale: 20})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	if err := sim.Start(sctx); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	var logs syncBuf
	done := make(chan int)
	go func() {
		done <- Run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--engine", "e0=" + sim.URL(),
			"--policy", "round-robin", "--no-events", "--capture-dir", dir, "--audit"}, &logs, Options{Ready: func(a, b string) { addrs <- [2]string{a, b} }})
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
	}
	system := strings.Repeat("You are the assistant of a bookshop; answer briefly and never invent delivery dates. ", 16)
	t0 := time.Date(2026, 12, 3, 17, 15, 2, 0, time.UTC)
	const n = 40
	for i := 0; i < n; i++ {
		stamp := t0.Add(time.Duration(i*13) * time.Second).Format("2006-01-02 15:04:05")
		body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "max_tokens": 3, "messages": []map[string]string{
			{"role": "system", "content": "Current time: " + stamp + ". " + system},
			{"role": "user", "content": fmt.Sprintf("Where is order %d?", i)}}})
		var resp *http.Response
		for try := 0; ; try++ {
			resp, err = http.Post("http://"+a[0]+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err == nil && (resp.StatusCode != http.StatusServiceUnavailable || try > 100) {
				break
			}
			if err == nil {
				resp.Body.Close()
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	var audit struct {
		Sampled  int
		Patterns []struct {
			Shape    string
			Block    int
			Examples []string
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + a[1] + "/debug/audit")
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&audit)
		resp.Body.Close()
		if len(audit.Patterns) > 0 && audit.Patterns[0].Shape != "<pending>" || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The chat template's "<|im_start|>system\n" and "Current time: " come first: the stamp's
	// varying seconds fall in 16-token block 1 (block 0 only where the stamp leads the text).
	if len(audit.Patterns) != 1 || audit.Patterns[0].Shape != "<timestamp>" || audit.Patterns[0].Block > 1 || len(audit.Patterns[0].Examples) != 0 {
		t.Fatalf("audit %+v, want one <timestamp> in the first blocks, without text", audit)
	}
	// The API port does not serve it.
	if resp, err := http.Get("http://" + a[0] + "/debug/audit"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("/debug/audit is served on the API port")
		}
	}
	m, _ := http.Get("http://" + a[1] + "/metrics")
	mb, _ := io.ReadAll(m.Body)
	m.Body.Close()
	for _, want := range []string{"kvroute_router_audit_patterns 1", fmt.Sprintf("kvroute_router_capture_records_total %d", n)} {
		if !bytes.Contains(mb, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The capture's counts are router-wide, in /debug/engines beside the engines.
	de, err := http.Get("http://" + a[1] + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	var dbg struct {
		Capture *capture.Stats `json:"capture"`
	}
	err = json.NewDecoder(de.Body).Decode(&dbg)
	de.Body.Close()
	if err != nil || dbg.Capture == nil || dbg.Capture.Records != uint64(n) || dbg.Capture.Dir != dir {
		t.Errorf("/debug/engines capture section %+v (%v); want %d records in %s", dbg.Capture, err, n, dir)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
	if c := strings.Count(logs.String(), "prompt audit:"); c != 1 {
		t.Errorf("%d audit log lines, want 1", c)
	}
	files, _ := capture.Files(dir)
	tr, err := fleet.LoadTrace(dir)
	if err != nil || len(files) != 1 {
		t.Fatalf("%v %v", files, err)
	}
	if len(tr.Requests) != n {
		t.Fatalf("%d captured, want %d", len(tr.Requests), n)
	}
	raw, _ := os.ReadFile(files[0])
	if bytes.Contains(raw, []byte("bookshop")) || bytes.Contains(raw, []byte("2026")) {
		t.Fatal("prompt text in the capture")
	}
	first := map[uint64]bool{}
	for _, q := range tr.Requests {
		if q.OutputLength != 3 || q.InputLength < 600 || len(q.HashIDs) != (q.InputLength+511)/512 {
			t.Fatalf("captured %+v: want the engine's 3 completion tokens and ceil(input/512) ids", q)
		}
		first[q.HashIDs[0]] = true
	}
	// The symptom the audit explains: the stamp makes every prompt's first 512-token block new.
	if len(first) != n {
		t.Fatalf("%d distinct first blocks in %d prompts", len(first), n)
	}
}

func metricValue(t *testing.T, scrape []byte, name string, labels ...string) float64 {
	t.Helper()
	v, ok := testkit.Metric(string(scrape), name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// A kv shadow beside round-robin on two engines: documents sent twice, the second time always
// to the other engine (round-robin's rotation), so production never hits them; the shadow,
// re-deciding on the same signals, picks the engine that holds each one.
func TestShadowThroughTheRouter(t *testing.T) {
	var engines []string
	for i := 0; i < 2; i++ {
		sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, TimeScale: 20})
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithCancel(context.Background())
		defer scancel()
		if err := sim.Start(sctx); err != nil {
			t.Fatal(err)
		}
		defer sim.Close()
		engines = append(engines, "--engine", fmt.Sprintf("e%d=%s", i, sim.URL()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	var logs syncBuf
	done := make(chan int)
	go func() {
		done <- Run(ctx, append(engines, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--policy", "round-robin",
			"--no-events", "--block-size", "16", "--shadow-policy", "kv"), &logs, Options{Ready: func(a, b string) { addrs <- [2]string{a, b} }})
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
	}
	send := func(prompt string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "prompt": prompt, "max_tokens": 1})
		for try := 0; ; try++ {
			resp, err := http.Post("http://"+a[0]+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
			if resp.StatusCode != http.StatusServiceUnavailable || try > 100 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	doc := func(i int) string {
		return strings.Repeat(fmt.Sprintf("Document %d says something of its own. ", i), 12)
	}
	const docs = 10
	for i := 0; i < docs; i++ {
		send(doc(i))
	}
	send("a filler that moves round-robin's rotation by one")
	for i := 0; i < docs; i++ {
		send(doc(i) + " Summarise it.")
	}
	m, _ := http.Get("http://" + a[1] + "/metrics")
	mb, _ := io.ReadAll(m.Body)
	m.Body.Close()
	disagree := metricValue(t, mb, "kvroute_router_shadow_decisions_total", `agree="false"`, `policy="kv"`)
	sh := metricValue(t, mb, "kvroute_router_shadow_cached_tokens_total", `pick="shadow"`, `policy="kv"`)
	pr := metricValue(t, mb, "kvroute_router_shadow_cached_tokens_total", `pick="production"`, `policy="kv"`)
	if disagree < docs || sh < 10*pr || sh < docs*200 {
		t.Errorf("shadow: %v disagreements, cached on its picks %v, on production's %v; want >= %d, and the documents' tokens on the shadow's side", disagree, sh, pr, docs)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}
