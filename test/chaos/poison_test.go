package chaos

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
)

// fakeEngine serves the two HTTP calls kvrouter makes to an engine that only publishes events
// here: the health probe and /v1/models.
func fakeEngine(t *testing.T, model string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"` + model + `","object":"model"}]}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// toks returns n token ids derived from seed.
func toks(seed uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*7919 + uint32(i)
	}
	return out
}

// A batch that once crash-looped kvrouter, held in a real replay ring behind a real PUB:
// every restarted router replays it, counts it once as a decode error, indexes the batches around
// it, stays up, and stops cleanly; three times over.
func TestPoisonBatchInReplayRingSurvivesRestarts(t *testing.T) {
	const model, bs = "m", 16
	eng := fakeEngine(t, model)
	u, _ := url.Parse(eng.URL)
	pub, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@" + u.Host + "@" + model})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	cache, err := kvtest.NewCache(blockkey.AlgoSHA256, "0", bs)
	if err != nil {
		t.Fatal(err)
	}
	// Published before any router subscribes: the batches live only in the ring.
	ev, err := cache.Store(toks(1, 3*bs), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ev); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishPayload(kvtest.OversizedBlockSizeBatch()); err != nil {
		t.Fatal(err)
	}
	if ev, err = cache.Store(toks(2, 2*bs), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ev); err != nil {
		t.Fatal(err)
	}
	want := float64(len(cache.Resident()))
	engine := "e=" + eng.URL + ";events=" + pub.Endpoint() + ";replay=" + pub.ReplayEndpoint()
	stream := []string{`engine="e"`, `rank="0"`}
	for run := 1; run <= 3; run++ {
		r := startRouter(t, "--engine", engine, "--model", model, "--block-size", "16")
		r.waitMetric(15*time.Second, "poison batch counted once", func(v float64) bool { return v == 1 },
			"kvroute_router_stream_decode_errors_total", stream...)
		r.waitMetric(15*time.Second, "ring indexed", func(v float64) bool { return v == want },
			"kvroute_router_index_blocks_gpu", stream...)
		r.waitMetric(15*time.Second, "stream exact", func(v float64) bool { return v == 1 },
			"kvroute_router_stream_state", append(stream, `state="exact"`)...)
		// The crash came about 0.1 s after start; give it ten times that, then check again.
		time.Sleep(time.Second)
		r.alive()
		if v, _ := r.metric("kvroute_router_stream_decode_errors_total", stream...); v != 1 {
			t.Fatalf("run %d: %v decode errors after a second, want the poison batch once", run, v)
		}
		if v, _ := r.metric("kvroute_router_stream_panics_total", stream...); v != 0 {
			t.Fatalf("run %d: %v panics recovered, want 0: the wire check should refuse the batch first", run, v)
		}
		if logs := r.logs(); !strings.Contains(logs, "does not decode") || !strings.Contains(logs, "block_size") {
			t.Fatalf("run %d: no log line naming the skipped batch:\n%s", run, logs)
		}
		r.stop()
	}
	if n := pub.ReplayRequests.Load(); n < 3 {
		t.Fatalf("%d replay requests served, want one per router start", n)
	}
}
