package app

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// slowConn opens a connection and sends partial bytes; it reports when the router closed it.
func slowConn(t *testing.T, addr, partial string) <-chan string {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, partial); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(bufio.NewReader(c))
		done <- string(b)
	}()
	return done
}

// Clients that send their body (or headers) too slowly are answered 408 (or dropped) and their
// connections closed within the configured timeouts.
func TestSlowClientsCut(t *testing.T) {
	sim := startSim(t, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{simEngine("e0", sim)}), func(o *Options) {
		o.Config.Limits.BodyReadTimeout.Duration = 200 * time.Millisecond
		o.Config.Limits.HeaderReadTimeout.Duration = 200 * time.Millisecond
	})
	api := httptest.NewUnstartedServer(rt.s.APIHandler())
	rt.s.ConfigureHTTP(api.Config)
	api.Start()
	defer api.Close()
	addr := strings.TrimPrefix(api.URL, "http://")
	const n = 50
	var bodies, heads []<-chan string
	for range n {
		bodies = append(bodies, slowConn(t, addr, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":"))
		heads = append(heads, slowConn(t, addr, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"))
	}
	t0 := time.Now()
	for i := range n {
		if got := <-bodies[i]; !strings.HasPrefix(got, "HTTP/1.1 408") || !strings.Contains(got, `"error"`) {
			t.Fatalf("slow body %d got %q", i, got)
		}
		<-heads[i] // closed (Go answers nothing or a 408 before closing)
	}
	if took := time.Since(t0); took > 3*time.Second {
		t.Fatalf("slow connections held for %v", took)
	}
	if v := testutil.ToFloat64(rt.s.met.Errors.WithLabelValues("", rt.s.policy, "body_timeout")); v != n {
		t.Fatalf("body timeouts counted %v", v)
	}
}

// hangingEngine accepts a stream (headers at once, as vLLM) and then sends keep-alives only.
func hangingEngine(t *testing.T, sim *vllmsim.Sim, afterTokens int) string {
	h := sim.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for i := range afterTokens {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\"}]}\n\n", i)
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A stream with no first token within limits.firstTokenTimeout is retried on another engine;
// one that goes silent after its first token is cut at limits.idleTimeout; a request over
// limits.requestTimeout before its first token is answered 504.
func TestRequestPathTimeouts(t *testing.T) {
	sim := startSim(t, vllmsim.Config{KVEventsPort: 0})
	good := startSim(t, vllmsim.Config{KVEventsPort: 0})
	rt := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "hang", URL: hangingEngine(t, sim, 0), Ready: true},
		{Name: "good", URL: good.URL(), Ready: true}}), func(o *Options) {
		o.Config.Policy = "round-robin"
		o.Config.Limits.FirstTokenTimeout.Duration = 150 * time.Millisecond
	})
	for i := range 4 {
		if r := postStream(rt.api.URL+"/v1/completions", streamPrompt(100_000+i, 32, 2)); !r.clean() {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	if testutil.ToFloat64(rt.s.met.Retries.WithLabelValues("hang")) == 0 {
		t.Fatal("the hanging engine's attempts were not retried")
	}

	rt2 := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "idle", URL: hangingEngine(t, sim, 2), Ready: true}}), func(o *Options) {
		o.Config.Limits.IdleTimeout.Duration = 150 * time.Millisecond
	})
	t0 := time.Now()
	if r := postStream(rt2.api.URL+"/v1/completions", streamPrompt(100_010, 32, 2)); !r.cut() || time.Since(t0) > 3*time.Second {
		t.Fatalf("idle stream: %+v after %v", r, time.Since(t0))
	}

	rt3 := startRouter(t, discovery.NewStatic([]discovery.Engine{{Name: "hang", URL: hangingEngine(t, sim, 0), Ready: true}}), func(o *Options) {
		o.Config.Limits.RequestTimeout.Duration = 150 * time.Millisecond
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if r := postStream(rt3.api.URL+"/v1/completions", streamPrompt(100_020, 32, 2)); r.status != http.StatusGatewayTimeout {
			t.Errorf("request timeout: %+v", r)
		}
	}()
	wg.Wait()
}
