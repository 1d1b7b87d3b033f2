package vllmsim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/kvwire"
)

// asyncComplete sends a completion in the background; the channel gets its status and body.
func asyncComplete(s *Sim, body map[string]any) <-chan httpResult {
	body["model"] = "m"
	buf, _ := json.Marshal(body)
	ch := make(chan httpResult, 1)
	go func() {
		resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(buf))
		if err != nil {
			ch <- httpResult{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		ch <- httpResult{status: resp.StatusCode, body: b}
	}()
	return ch
}

func isSleeping(t *testing.T, s *Sim) bool {
	t.Helper()
	r := get(t, s, "/is_sleeping")
	if r.status != http.StatusOK {
		t.Fatalf("/is_sleeping: %d %s", r.status, r.body)
	}
	return decodeJSON[struct {
		IsSleeping bool `json:"is_sleeping"`
	}](t, r).IsSleeping
}

// POST /sleep (level 1, mode abort: vLLM's defaults) empties the prefix cache with an
// AllBlocksCleared batch, queues requests that arrive while asleep, and POST /wake_up runs them.
func TestSleepClearsPrefixCacheAndWakeUpResumes(t *testing.T) {
	s := startSim(t, eventConfig())
	sub := subscribe(t, s.EventEndpoints()[0], s.Topic())
	complete(t, s, map[string]any{"prompt": seqTokens(0, 64)})
	if _, b := recvBatch(t, sub); b.Events[0].Type != kvwire.EventBlockStored {
		t.Fatalf("first batch %v", b.Events[0].Type)
	}
	if isSleeping(t, s) {
		t.Fatal("sleeping before /sleep")
	}
	if r := post(t, s, "/sleep", ""); r.status != http.StatusOK {
		t.Fatalf("/sleep: %d %s", r.status, r.body)
	}
	m, b := recvBatch(t, sub)
	if m.Seq != 1 || len(b.Events) != 1 || b.Events[0].Type != kvwire.EventAllBlocksCleared {
		t.Fatalf("after /sleep: seq %d events %+v, want AllBlocksCleared", m.Seq, b.Events)
	}
	if n := len(s.CacheState().Ranks[0].Hashes); n != 0 || !isSleeping(t, s) {
		t.Fatalf("asleep: %d cached hashes, is_sleeping %v", n, isSleeping(t, s))
	}
	pending := asyncComplete(s, map[string]any{"prompt": seqTokens(0, 64), "max_tokens": 1})
	testkit.WaitFor(t, 5*time.Second, "the request to queue", func() bool { return s.CacheState().Ranks[0].Waiting == 1 })
	if !strings.Contains(string(get(t, s, "/metrics").body), `vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 1`) {
		t.Error("queued request not counted as waiting for capacity")
	}
	select {
	case r := <-pending:
		t.Fatalf("a request ran while asleep: %d %s", r.status, r.body)
	case <-time.After(100 * time.Millisecond):
	}
	if r := post(t, s, "/wake_up?tags=weights&tags=kv_cache", ""); r.status != http.StatusOK || !isSleeping(t, s) {
		t.Fatalf("/wake_up weights+kv_cache: %d; still sleeping %v, want true (scheduling asleep)", r.status, isSleeping(t, s))
	}
	if r := post(t, s, "/wake_up", ""); r.status != http.StatusOK || isSleeping(t, s) {
		t.Fatalf("/wake_up: %d; sleeping %v", r.status, isSleeping(t, s))
	}
	select {
	case r := <-pending:
		if r.status != http.StatusOK {
			t.Fatalf("queued request after wake-up: %d %s", r.status, r.body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("queued request never ran after wake-up")
	}
	if m, b := recvBatch(t, sub); m.Seq != 2 || b.Events[0].Type != kvwire.EventBlockStored {
		t.Errorf("after wake-up: seq %d %v, want the recomputed blocks stored", m.Seq, b.Events[0].Type)
	}
}

// Level 0 only pauses scheduling: no event, the cache stays; mode abort fails requests in
// flight; bad parameters are refused.
func TestSleepLevelZeroAndAbort(t *testing.T) {
	cfg := eventConfig()
	cfg.DecodeMsPerToken = 20
	s := startSim(t, cfg)
	sub := subscribe(t, s.EventEndpoints()[0], s.Topic())
	complete(t, s, map[string]any{"prompt": seqTokens(0, 32)})
	recvBatch(t, sub)
	slow := asyncComplete(s, map[string]any{"prompt": seqTokens(500, 20), "max_tokens": 1000})
	testkit.WaitFor(t, 5*time.Second, "the slow request to run", func() bool { return s.CacheState().Ranks[0].Running == 1 })
	if r := post(t, s, "/sleep?level=0", ""); r.status != http.StatusOK {
		t.Fatalf("/sleep?level=0: %d %s", r.status, r.body)
	}
	select {
	case r := <-slow:
		if r.status == http.StatusOK {
			t.Errorf("request in flight completed through an abort sleep: %s", r.body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("request in flight not aborted by /sleep")
	}
	// The aborted request's first block was stored; nothing else may follow (no AllBlocksCleared).
	for {
		_ = sub.SetRcvtimeo(200 * time.Millisecond)
		frames, err := sub.RecvMessageBytes(0)
		if err != nil {
			break
		}
		m, _ := kvwire.ParseFrames(frames)
		b, _ := kvwire.NewDecoder().DecodeBatch(m.Payload)
		for _, ev := range b.Events {
			if ev.Type == kvwire.EventAllBlocksCleared {
				t.Fatal("level 0 sleep cleared the prefix cache")
			}
		}
	}
	if n := len(s.CacheState().Ranks[0].Hashes); n < 2 || !isSleeping(t, s) {
		t.Errorf("level 0: %d cached hashes (want the first prompt's 2 at least), sleeping %v", n, isSleeping(t, s))
	}
	post(t, s, "/wake_up?tags=scheduling", "")
	if isSleeping(t, s) {
		t.Error("still sleeping after waking scheduling from level 0")
	}
	post(t, s, "/sleep?level=1&mode=keep", "")
	if r := post(t, s, "/debug/restart", ""); r.status != http.StatusOK || isSleeping(t, s) {
		t.Errorf("restart: %d, sleeping %v; a restarted engine is awake", r.status, isSleeping(t, s))
	}
	complete(t, s, map[string]any{"prompt": seqTokens(0, 20)}) // and schedules again
	for _, q := range []string{"level=3", "level=x", "mode=later"} {
		if r := post(t, s, "/sleep?"+q, ""); r.status != http.StatusBadRequest {
			t.Errorf("/sleep?%s: %d, want 400", q, r.status)
		}
	}
}

// sleepStateSeries reads vllm:engine_sleep_state's awake, weights_offloaded and discard_all
// for one engine from /metrics.
func sleepStateSeries(t *testing.T, s *Sim, engine string) [3]string {
	t.Helper()
	body := string(get(t, s, "/metrics").body)
	var out [3]string
	for i, state := range []string{"awake", "weights_offloaded", "discard_all"} {
		prefix := `vllm:engine_sleep_state{engine="` + engine + `",model_name="m",sleep_state="` + state + `"} `
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, prefix); ok {
				out[i] = v
			}
		}
		if out[i] == "" {
			t.Fatalf("no %s series for engine %s in /metrics", state, engine)
		}
	}
	return out
}

// vllm:engine_sleep_state follows vLLM's record_sleep_state: (1, level) on sleep, (0, 0) on any
// wake_up, on every engine: awake 1 by default, weights_offloaded at level 1, discard_all at
// level 2, neither at level 0; a partial wake_up already reads awake.
func TestEngineSleepStateGauge(t *testing.T) {
	s := startSim(t, Config{Host: "127.0.0.1", Model: "m", DataParallelSize: 2})
	awake, level1, level2, level0 := [3]string{"1", "0", "0"}, [3]string{"0", "1", "0"}, [3]string{"0", "0", "1"}, [3]string{"0", "0", "0"}
	check := func(when string, want [3]string) {
		t.Helper()
		for _, e := range []string{"0", "1"} {
			if got := sleepStateSeries(t, s, e); got != want {
				t.Errorf("%s, engine %s: awake, weights_offloaded, discard_all = %v, want %v", when, e, got, want)
			}
		}
	}
	check("at start", awake)
	for _, step := range []struct {
		path string
		want [3]string
	}{
		{"/sleep", level1},
		{"/wake_up?tags=weights", awake},
		{"/wake_up", awake},
		{"/sleep?level=2", level2},
		{"/wake_up", awake},
		{"/sleep?level=0", level0},
		{"/wake_up?tags=scheduling", awake},
	} {
		if r := post(t, s, step.path, ""); r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", step.path, r.status, r.body)
		}
		check("after "+step.path, step.want)
	}
	post(t, s, "/sleep?level=1&mode=keep", "")
	post(t, s, "/debug/restart", "")
	check("after a restart", awake)
}
