package app

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// With a tracer, a request gets a server span under the client's traceparent, with the
// tokenize, decide and forward spans under it; the forward span marks the first token and the
// request span carries the outcome.
func TestRequestSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0, KVReplayPort: 0})
	// The engine's HTTP side behind a recorder of the trace context each generation carried.
	engines := f.engines()
	simURL, _ := url.Parse(engines[0].URL)
	fwd := httputil.NewSingleHostReverseProxy(simURL)
	got := make(chan string, 4)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			got <- r.Header.Get("Traceparent")
		}
		fwd.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	engines[0].URL = front.URL
	rt := startRouter(t, discovery.NewStatic(engines), func(o *Options) { o.Tracer = tp.Tracer("test") })
	rt.waitStreams(t, "exact")

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	body := strings.Replace(idsPrompt(1, 64, 0, 0, 2), `{"model"`, `{"stream":true,"model"`, 1)
	req, _ := http.NewRequest(http.MethodPost, rt.api.URL+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body) // to the end: a client that leaves early is an outcome of its own
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	if !testkit.Until(waitBound, func() bool {
		for _, s := range rec.Ended() {
			spans[s.Name()] = s
		}
		return spans["kvroute.request"] != nil
	}) {
		t.Fatalf("no request span ended; spans %v", spans)
	}
	top := spans["kvroute.request"]
	if got := top.SpanContext().TraceID().String(); got != traceID {
		t.Errorf("request span in trace %s, want the client's %s", got, traceID)
	}
	if got := top.Parent().SpanID().String(); got != parentID {
		t.Errorf("request span's parent %s, want the client's span %s", got, parentID)
	}
	for _, name := range []string{"kvroute.tokenize", "kvroute.decide", "kvroute.forward"} {
		s := spans[name]
		if s == nil {
			t.Errorf("no %s span", name)
			continue
		}
		if s.Parent().SpanID() != top.SpanContext().SpanID() {
			t.Errorf("%s is not under the request span", name)
		}
	}
	if fw := spans["kvroute.forward"]; fw != nil {
		// The engine's spans hang under the attempt that reached it, in the client's trace.
		if want := "00-" + traceID + "-" + fw.SpanContext().SpanID().String() + "-01"; len(got) != 1 || <-got != want {
			t.Errorf("the engine was not given traceparent %s", want)
		}
		if ev := fw.Events(); len(ev) != 1 || ev[0].Name != "first_token" {
			t.Errorf("forward span events %v, want one first_token", ev)
		}
	}
	attrs := map[string]string{}
	for _, kv := range top.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["kvroute.outcome"] != "ok" || attrs["kvroute.stream"] != "true" {
		t.Errorf("request span attributes %v, want outcome ok, stream true", attrs)
	}
}

// In picker mode the spans are the proxy's: kvroute.request under the gateway's traceparent
// (from the request headers it streams), tokenize and decide under it, and a serve span from
// the pick to the answer's end with the first token marked, whose trace context the engine
// gets (a request header the gateway sets).
func TestPickerSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0, KVReplayPort: 0})
	engines := f.engines()
	rt := startRouter(t, discovery.NewStatic(engines), func(o *Options) { o.Tracer = tp.Tracer("test") })
	rt.waitStreams(t, "exact")
	gw, _ := startPicker(t, rt, false)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	body := strings.Replace(idsPrompt(1, 64, 0, 0, 2), `{"model"`, `{"stream":true,"model"`, 1)
	res, err := gw.Do(t.Context(), gatewaytest.Request{Path: "/v1/completions", Body: []byte(body),
		Header: http.Header{"Traceparent": {"00-" + traceID + "-" + parentID + "-01"}}})
	if err != nil || res.Status != http.StatusOK {
		t.Fatalf("%v %+v", err, res)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	if !testkit.Until(waitBound, func() bool {
		for _, s := range rec.Ended() {
			spans[s.Name()] = s
		}
		return spans["kvroute.request"] != nil
	}) {
		t.Fatalf("no request span ended; spans %v", spans)
	}
	top := spans["kvroute.request"]
	if top.SpanContext().TraceID().String() != traceID || top.Parent().SpanID().String() != parentID {
		t.Errorf("request span in trace %s under %s, want the gateway's %s under %s", top.SpanContext().TraceID(), top.Parent().SpanID(), traceID, parentID)
	}
	for _, name := range []string{"kvroute.tokenize", "kvroute.decide", "kvroute.serve"} {
		if s := spans[name]; s == nil || s.Parent().SpanID() != top.SpanContext().SpanID() {
			t.Errorf("%s missing or not under the request span", name)
		}
	}
	if sv := spans["kvroute.serve"]; sv != nil {
		// The gateway forwards the request headers the picker sets.
		if want := "00-" + traceID + "-" + sv.SpanContext().SpanID().String() + "-01"; res.SetHeaders.Get("Traceparent") != want {
			t.Errorf("the picker set traceparent %q for the engine, want %s", res.SetHeaders.Get("Traceparent"), want)
		}
		if ev := sv.Events(); len(ev) != 1 || ev[0].Name != "first_token" {
			t.Errorf("serve span events %v, want one first_token", ev)
		}
	}
	attrs := map[string]string{}
	for _, kv := range top.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["kvroute.outcome"] != "ok" || attrs["kvroute.stream"] != "true" {
		t.Errorf("request span attributes %v, want outcome ok, stream true", attrs)
	}
}
