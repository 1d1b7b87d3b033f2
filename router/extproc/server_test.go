package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/router/extproc"
	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/router/proxy"
)

// fakePicker picks the first endpoint within the subset and records what it was told.
type fakePicker struct {
	endpoints []string
	shed      bool
	rewrite   bool // add stream_options.include_usage and drop the usage chunk

	mu       sync.Mutex
	bookings []*fakeBooking
	subsets  []extproc.Subset
}

type fakePrepared struct {
	stream  bool
	body    []byte
	dropUse bool
}

func (p *fakePrepared) Stream() bool         { return p.stream }
func (p *fakePrepared) Body() []byte         { return p.body }
func (p *fakePrepared) DropUsageChunk() bool { return p.dropUse }
func (p *fakePrepared) API() proxy.API       { return proxy.APIOpenAI }

func (f *fakePicker) Prepare(_ context.Context, r *extproc.Request) (extproc.Prepared, *extproc.Refusal) {
	var req struct {
		Stream bool `json:"stream"`
	}
	if err := json.Unmarshal(r.Body, &req); err != nil {
		return nil, &extproc.Refusal{Status: 400, Body: extproc.ErrorJSON(400, "invalid_request_error", "bad JSON: "+err.Error())}
	}
	p := &fakePrepared{stream: req.Stream}
	if f.rewrite && req.Stream {
		p.body = bytes.Replace(r.Body, []byte(`"stream":true`), []byte(`"stream":true,"stream_options":{"include_usage":true}`), 1)
		p.dropUse = true
	}
	return p, nil
}

func (f *fakePicker) Pick(_ context.Context, _ extproc.Prepared, sub extproc.Subset) (extproc.Booking, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subsets = append(f.subsets, sub)
	if f.shed {
		return nil, extproc.ErrShed
	}
	var eps []string
	for _, e := range f.endpoints {
		if extproc.InSubset(sub, e) {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, extproc.ErrNoEndpoint
	}
	b := &fakeBooking{eps: eps, ended: make(chan struct{})}
	f.bookings = append(f.bookings, b)
	return b, nil
}

func (f *fakePicker) last() *fakeBooking {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bookings[len(f.bookings)-1]
}

type fakeBooking struct {
	eps    []string
	mu     sync.Mutex
	served string
	first  int
	res    extproc.Result
	ends   int
	ended  chan struct{}
}

func (b *fakeBooking) Endpoints() []string { return b.eps }
func (b *fakeBooking) Headers() map[string]string {
	return map[string]string{"x-data-parallel-rank": "0"}
}
func (b *fakeBooking) Served(ep string) { b.mu.Lock(); b.served = ep; b.mu.Unlock() }
func (b *fakeBooking) FirstToken()      { b.mu.Lock(); b.first++; b.mu.Unlock() }
func (b *fakeBooking) End(res extproc.Result) {
	b.mu.Lock()
	b.res = res
	b.ends++
	b.mu.Unlock()
	close(b.ended)
}

func (b *fakeBooking) wait(t *testing.T) extproc.Result {
	t.Helper()
	select {
	case <-b.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the booking never ended")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.res
}

// engine is a stand-in OpenAI server: streams three tokens and a usage chunk, or one JSON answer.
func engine(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream        bool `json:"stream"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		usage := `{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}`
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"choices":[{"message":{"content":"a b c"}}],"usage":%s}`, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		fmt.Fprint(w, ": keep-alive\n\n")
		fl.Flush()
		for _, tok := range []string{"a", "b", "c"} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", tok)
			fl.Flush()
		}
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\n", usage)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func serve(t *testing.T, p extproc.Picker, o extproc.Options) (*extproc.Server, *gatewaytest.Gateway) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := extproc.New(p, o)
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	gw, err := gatewaytest.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return s, gw
}

func chat(stream bool, promptBytes int) []byte {
	b, _ := json.Marshal(map[string]any{"model": "m", "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": strings.Repeat("x", promptBytes)}}})
	return b
}

func TestFullDuplexPickStreamsBodyInPiecesAndLearnsTheAnswer(t *testing.T) {
	ep := engine(t)
	fp := &fakePicker{endpoints: []string{ep}, rewrite: true}
	_, gw := serve(t, fp, extproc.Options{})
	body := chat(true, 200_000) // several pieces of ChunkLimit each way
	res, err := gw.Do(t.Context(), gatewaytest.Request{Body: body, Chunk: 7000})
	if err != nil {
		t.Fatal(err)
	}
	if res.Immediate || res.Status != 200 {
		t.Fatalf("status %d immediate %v: %s", res.Status, res.Immediate, res.ClientBody)
	}
	if got := strings.Join(res.Endpoints, ","); got != ep || res.MetadataPick != ep {
		t.Fatalf("pick header %q metadata %q, want %q in both", got, res.MetadataPick, ep)
	}
	if res.MaxPiece > extproc.ChunkLimit || res.MaxPiece == 0 {
		t.Fatalf("largest body piece %d, want 1..%d", res.MaxPiece, extproc.ChunkLimit)
	}
	if !bytes.Contains(res.UpstreamBody, []byte(`"include_usage":true`)) || len(res.UpstreamBody) < len(body) {
		t.Fatalf("the upstream body is not the picker's rewrite (%d bytes)", len(res.UpstreamBody))
	}
	if res.SetHeaders.Get("x-data-parallel-rank") != "0" {
		t.Fatalf("the booking's headers were not set: %v", res.SetHeaders)
	}
	if bytes.Contains(res.ClientBody, []byte(`"usage"`)) || !bytes.Contains(res.ClientBody, []byte("[DONE]")) {
		t.Fatalf("client body kept the picker's usage chunk or lost [DONE]:\n%s", res.ClientBody)
	}
	b := fp.last()
	r := b.wait(t)
	if r.Phase != extproc.Complete || r.Usage == nil || !r.Usage.HasCached || r.Usage.CachedTokens != 32 || r.Usage.PromptTokens != 40 {
		t.Fatalf("result %+v usage %+v", r, r.Usage)
	}
	if b.first != 1 || b.served != ep || r.Served != ep || r.TTFT <= 0 {
		t.Fatalf("first tokens %d served %q/%q ttft %v", b.first, b.served, r.Served, r.TTFT)
	}
}

func TestBufferedModePicksOnTheBodyAnswer(t *testing.T) {
	ep := engine(t)
	fp := &fakePicker{endpoints: []string{ep}}
	_, gw := serve(t, fp, extproc.Options{})
	res, err := gw.Do(t.Context(), gatewaytest.Request{Body: chat(false, 100), Mode: gatewaytest.Buffered})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 200 || len(res.Endpoints) != 1 || res.Endpoints[0] != ep {
		t.Fatalf("status %d pick %v", res.Status, res.Endpoints)
	}
	r := fp.last().wait(t)
	if r.Phase != extproc.Complete || r.Usage == nil || r.Usage.CachedTokens != 32 {
		t.Fatalf("result %+v", r)
	}
}

func TestSubsetHintRestrictsThePick(t *testing.T) {
	fp := &fakePicker{endpoints: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.2:8001"}}
	_, gw := serve(t, fp, extproc.Options{})
	fake := []byte(`{"choices":[{"message":{"content":"a"}}]}`)
	for _, tc := range []struct {
		name     string
		subset   []string
		asString bool
		want     string
	}{
		{"list", []string{"10.0.0.2:8001"}, false, "10.0.0.2:8001"},
		{"string", []string{"10.0.0.2:8000", "10.0.0.2:8001"}, true, "10.0.0.2:8000,10.0.0.2:8001"},
		{"bare address", []string{"10.0.0.2"}, false, "10.0.0.2:8000,10.0.0.2:8001"},
	} {
		res, err := gw.Do(t.Context(), gatewaytest.Request{Body: chat(false, 10), HasSubset: true, Subset: tc.subset,
			SubsetAsString: tc.asString, NoForward: true, Fake: fake})
		if err != nil {
			t.Fatal(tc.name, err)
		}
		if got := strings.Join(res.Endpoints, ","); got != tc.want {
			t.Errorf("%s: pick %q, want %q", tc.name, got, tc.want)
		}
	}
	for _, sub := range [][]string{{}, {"192.0.2.9:1"}} {
		res, err := gw.Do(t.Context(), gatewaytest.Request{Body: chat(false, 10), HasSubset: true, Subset: sub, NoForward: true})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Immediate || res.Status != 503 {
			t.Fatalf("subset %v: immediate %v status %d, want 503", sub, res.Immediate, res.Status)
		}
	}
}

func TestImmediateResponses(t *testing.T) {
	fp := &fakePicker{endpoints: []string{"10.0.0.1:8000"}}
	_, gw := serve(t, fp, extproc.Options{MaxBodyBytes: 4096})
	check := func(name string, res *gatewaytest.Result, err error, code int, typ string) {
		t.Helper()
		if err != nil {
			t.Fatal(name, err)
		}
		var eb struct {
			Error struct {
				Type string `json:"type"`
				Code int    `json:"code"`
			} `json:"error"`
		}
		if !res.Immediate || res.Status != code || json.Unmarshal(res.ClientBody, &eb) != nil || eb.Error.Type != typ || eb.Error.Code != code {
			t.Fatalf("%s: immediate %v status %d body %s", name, res.Immediate, res.Status, res.ClientBody)
		}
	}
	res, err := gw.Do(t.Context(), gatewaytest.Request{Body: []byte(`{"model":`)})
	check("bad body", res, err, 400, "invalid_request_error")
	res, err = gw.Do(t.Context(), gatewaytest.Request{Body: chat(false, 10_000), Chunk: 1000})
	check("too large", res, err, 413, "invalid_request_error")
	fp.shed = true
	res, err = gw.Do(t.Context(), gatewaytest.Request{Body: chat(false, 10)})
	check("shed", res, err, 429, "rate_limit_error")
}

func TestCutAndClientGoneEndTheBooking(t *testing.T) {
	ep := engine(t)
	fp := &fakePicker{endpoints: []string{ep}}
	_, gw := serve(t, fp, extproc.Options{})
	// The upstream breaks after the first token event.
	if _, err := gw.Do(t.Context(), gatewaytest.Request{Body: chat(true, 10), CutAfter: 80}); err != nil {
		t.Fatal(err)
	}
	b := fp.last()
	if r := b.wait(t); r.Phase != extproc.Cut || b.first != 1 {
		t.Fatalf("cut: phase %v first %d", r.Phase, b.first)
	}
	if _, err := gw.Do(t.Context(), gatewaytest.Request{Body: chat(true, 10), LeaveAfterPick: true}); err != nil {
		t.Fatal(err)
	}
	b = fp.last()
	if r := b.wait(t); r.Phase != extproc.Abandoned || b.first != 0 || b.ends != 1 {
		t.Fatalf("client gone: phase %v first %d ends %d", r.Phase, b.first, b.ends)
	}
}

func TestConformanceHooks(t *testing.T) {
	fp := &fakePicker{endpoints: []string{"10.0.0.1:8000", "10.0.0.2:8000"}}
	_, gw := serve(t, fp, extproc.Options{ConformanceHooks: true})
	fake := []byte(`{"choices":[{"message":{"content":"a"}}]}`)
	res, err := gw.Do(t.Context(), gatewaytest.Request{Body: chat(false, 10), NoForward: true, Fake: fake,
		Header: http.Header{"Test-Epp-Endpoint-Selection": {"10.0.0.2:8000"}}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(res.Endpoints, ",") != "10.0.0.2:8000" || res.ResponseHdrs.Get(extproc.TestServedHeader) != "10.0.0.2:8000" {
		t.Fatalf("pick %v served echo %q", res.Endpoints, res.ResponseHdrs.Get(extproc.TestServedHeader))
	}
	// Off, the header steers nothing.
	_, gw2 := serve(t, fp, extproc.Options{})
	res, err = gw2.Do(t.Context(), gatewaytest.Request{Body: chat(false, 10), NoForward: true, Fake: fake,
		Header: http.Header{"Test-Epp-Endpoint-Selection": {"10.0.0.2:8000"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Endpoints[0] != "10.0.0.1:8000" || res.ResponseHdrs.Get(extproc.TestServedHeader) != "" {
		t.Fatalf("hooks off: pick %v echo %q", res.Endpoints, res.ResponseHdrs.Get(extproc.TestServedHeader))
	}
}

func TestHealthServices(t *testing.T) {
	s, gw := serve(t, &fakePicker{}, extproc.Options{})
	hc := healthpb.NewHealthClient(gw.Conn())
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(svc, err)
		}
		return r.GetStatus()
	}
	if status("liveness") != healthpb.HealthCheckResponse_SERVING || status("readiness") != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatal("a new picker must be live and not ready")
	}
	s.SetReady(true)
	for _, svc := range []string{"", "readiness", extproc.ServiceName} {
		if status(svc) != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%q not serving once ready", svc)
		}
	}
}

func TestBodyTimeoutAnswers408(t *testing.T) {
	fp := &fakePicker{endpoints: []string{"10.0.0.1:8000"}}
	_, gw := serve(t, fp, extproc.Options{BodyTimeout: 50 * time.Millisecond})
	// A body that never ends: the gateway sends one piece without end_of_stream.
	res, err := gw.Do(t.Context(), gatewaytest.Request{Body: chat(false, 10), Chunk: 5, Mode: gatewaytest.FullDuplex, StallBody: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Immediate || res.Status != 408 {
		t.Fatalf("immediate %v status %d", res.Immediate, res.Status)
	}
}
