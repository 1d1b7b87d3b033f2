package report

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// The reporter applies its own entry to the status subresource as kvrouter-<pod>, at once when
// a reason begins or ends, and otherwise (a detail that moved included) only when the heartbeat
// is due.
func TestSyncWritesOnChangeAndHeartbeat(t *testing.T) {
	var mu sync.Mutex
	var bodies []map[string]any
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPatch || r.URL.Path != "/apis/serving.kvroute.io/v1alpha1/namespaces/llm/kvroutedmodels/qwen/status" ||
			r.Header.Get("Content-Type") != "application/apply-patch+yaml" {
			http.Error(w, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"), http.StatusBadRequest)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var v map[string]any
		_ = json.Unmarshal(b, &v)
		mu.Lock()
		bodies, queries = append(bodies, v), append(queries, r.URL.RawQuery)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var cur []Degraded
	r, err := New(&rest.Config{Host: srv.URL}, Options{Namespace: "llm", Model: "qwen", Pod: "qwen-router-0",
		Source: func() []Degraded { return cur }, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	step := func(d time.Duration, wantWrites int) {
		t.Helper()
		now = now.Add(d)
		if err := r.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(bodies) != wantWrites {
			t.Fatalf("%d writes, want %d", len(bodies), wantWrites)
		}
	}
	step(0, 1)             // first: written
	step(5*time.Second, 1) // unchanged
	cur = []Degraded{{Replica: "e/0", Reason: "hash-mismatch", Since: now, Detail: "x"}}
	step(5*time.Second, 2) // changed: at once
	cur = []Degraded{{Replica: "e/0", Reason: "hash-mismatch", Since: cur[0].Since, Detail: "y"}}
	step(5*time.Second, 2)                  // the detail alone: waits for the heartbeat
	step(DefaultHeartbeat-6*time.Second, 2) // unchanged, heartbeat not due (a second short)
	step(time.Second, 3)                    // heartbeat, DefaultHeartbeat after the last write, with the newest detail
	if d := bodies[2]["status"].(map[string]any)["routerReports"].([]any)[0].(map[string]any)["degraded"].([]any)[0].(map[string]any); d["detail"] != "y" {
		t.Fatalf("heartbeat entry %v", d)
	}
	cur = append(cur, Degraded{Replica: "e/1", Reason: "no-events", Since: now, Detail: "z"})
	step(time.Second, 4) // another reason began: at once
	if q := queries[0]; q != "fieldManager=kvrouter-qwen-router-0&force=true" {
		t.Fatalf("query %q", q)
	}
	st := bodies[1]["status"].(map[string]any)["routerReports"].([]any)[0].(map[string]any)
	if st["pod"] != "qwen-router-0" || len(st["degraded"].([]any)) != 1 || st["observedAt"] == nil {
		t.Fatalf("entry %v", st)
	}
}

// With peers the entry lists them, and a change of peers is written at once.
func TestSyncWritesPeers(t *testing.T) {
	var mu sync.Mutex
	var peers [][]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var v map[string]any
		_ = json.Unmarshal(b, &v)
		e := v["status"].(map[string]any)["routerReports"].([]any)[0].(map[string]any)
		mu.Lock()
		p, _ := e["peers"].([]any)
		peers = append(peers, p)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cur := []string{"r2"}
	r, err := New(&rest.Config{Host: srv.URL}, Options{Namespace: "llm", Model: "qwen", Pod: "r1",
		Source: func() []Degraded { return nil }, Peers: func() []string { return cur }, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Sync(context.Background())
	cur = []string{"r2", "r3"}
	now = now.Add(5 * time.Second)
	_ = r.Sync(context.Background())
	mu.Lock()
	defer mu.Unlock()
	if len(peers) != 2 || len(peers[0]) != 1 || len(peers[1]) != 2 || peers[1][1] != "r3" {
		t.Fatalf("peers written: %v", peers)
	}
}

// The write rate the heartbeat costs (20 s, so that a router that stops shows within 60 s): ten minutes of Sync once a second, as Run does, with one
// fault whose detail moves at every 5 s sample and one reason that begins and ends, count
// 60 s / DefaultHeartbeat writes a minute, plus about one per change (a change restarts the
// heartbeat). With the former 60 s heartbeat the same run wrote 12 times (1.2 a minute), now
// 31 (3.1 a minute).
func TestHeartbeatWriteRate(t *testing.T) {
	var mu sync.Mutex
	writes := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		writes++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	since := start
	cur := []Degraded{{Replica: "e/0", Reason: "stalled", Since: since}}
	for _, hb := range []struct {
		heartbeat time.Duration
		want      int
	}{{time.Minute, 12}, {DefaultHeartbeat, 31}} {
		now, writes = start, 0
		// QPS: client-go's default limiter (5/s) would only slow the test down.
		r, err := New(&rest.Config{Host: srv.URL, QPS: 1000, Burst: 1000}, Options{Namespace: "llm", Model: "qwen", Pod: "r", Heartbeat: hb.heartbeat,
			Source: func() []Degraded { return cur }, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		for sec := 0; sec < 600; sec++ {
			now = start.Add(time.Duration(sec) * time.Second)
			cur = []Degraded{{Replica: "e/0", Reason: "stalled", Since: since, Detail: fmt.Sprintf("%d messages received", sec/5)}}
			if sec >= 205 && sec < 405 { // a second reason, begun and ended between heartbeats
				cur = append(cur, Degraded{Replica: "e/1", Reason: "no-events", Since: start.Add(205 * time.Second)})
			}
			if err := r.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		got := writes
		mu.Unlock()
		t.Logf("heartbeat %v: %d status writes in 10 minutes (%.1f a minute)", hb.heartbeat, got, float64(got)/10)
		if got != hb.want {
			t.Errorf("heartbeat %v: %d writes, want %d", hb.heartbeat, got, hb.want)
		}
	}
}

// Starting and stopping to hold requests is written at once (the demand that wakes a model at
// zero must not wait for the heartbeat); a count that moves while holding waits for it, so a
// busy hold does not write at every request. The backlog rides on each write, read then only.
func TestSyncWritesHeldAtOnce(t *testing.T) {
	var mu sync.Mutex
	var entries []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var v map[string]any
		_ = json.Unmarshal(b, &v)
		mu.Lock()
		entries = append(entries, v["status"].(map[string]any)["routerReports"].([]any)[0].(map[string]any))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	held, backlogReads := 0, 0
	backlog, measured := 0.0, false
	r, err := New(&rest.Config{Host: srv.URL, QPS: 1000, Burst: 1000}, Options{Namespace: "llm", Model: "qwen", Pod: "r1",
		Source: func() []Degraded { return nil }, Held: func() int { return held },
		Backlog: func() (float64, bool) { backlogReads++; return backlog, measured }, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	step := func(d time.Duration, wantWrites int) map[string]any {
		t.Helper()
		now = now.Add(d)
		if err := r.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(entries) != wantWrites {
			t.Fatalf("%d writes, want %d", len(entries), wantWrites)
		}
		if backlogReads != wantWrites {
			t.Fatalf("backlog read %d times for %d writes", backlogReads, wantWrites)
		}
		return entries[len(entries)-1]
	}
	if e := step(0, 1); e["held"] != 0.0 || e["backlogSeconds"] != nil {
		t.Fatalf("first entry %v: want held 0 and no backlog (not measured)", e)
	}
	held = 1
	if e := step(time.Second, 2); e["held"] != 1.0 {
		t.Fatalf("held entry %v", e)
	}
	held = 7 // still holding: waits for the heartbeat
	step(time.Second, 2)
	backlog, measured = 1.2345, true
	if e := step(DefaultHeartbeat, 3); e["held"] != 7.0 || e["backlogSeconds"] != "1235m" {
		t.Fatalf("heartbeat entry %v: want held 7, backlogSeconds 1235m", e)
	}
	held = 0
	if e := step(time.Second, 4); e["held"] != 0.0 {
		t.Fatalf("released entry %v", e)
	}
}
