package app

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// sidecar plays llm-d's routing sidecar on a decode pod: a request carrying PrefillHeader has
// its prefill leg sent to that endpoint (vLLM's protocol, proxy.PrefillLeg), then goes to the
// local engine with the answer's kv_transfer_params (proxy.DecodeLeg); without the header, and
// for every other call (metrics, health, tokenize), the request goes to the engine as it came.
type sidecar struct {
	engine string
	mu     sync.Mutex
	// prefills are the endpoints the prefill legs went to, in order.
	prefills []string
}

func startSidecar(t *testing.T, engine string) (*sidecar, string) {
	sc := &sidecar{engine: engine}
	srv := httptest.NewServer(sc)
	t.Cleanup(srv.Close)
	return sc, srv.URL
}

func (sc *sidecar) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if hp := r.Header.Get(PrefillHeader); hp != "" && r.Method == http.MethodPost {
		sc.mu.Lock()
		sc.prefills = append(sc.prefills, hp)
		sc.mu.Unlock()
		pre, err := proxy.PrefillLeg(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := http.Post("http://"+hp+r.URL.Path, "application/json", bytes.NewReader(pre))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		ans, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		params, err := proxy.TransferParams(ans)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if body, err = proxy.DecodeLeg(body, params); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, sc.engine+r.URL.RequestURI(), bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

func (sc *sidecar) prefilled() []string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return append([]string(nil), sc.prefills...)
}

func hostOf(t *testing.T, u string) string {
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Host
}

// On a fleet with both pools the picker picks a decode replica as the destination and a prefill
// replica by cache overlap in the prefill pool, named in llm-d's x-prefiller-host-port for the
// decode pod's sidecar, which runs vLLM's two legs: the decode engine reports the pulled prompt
// as cached, which is what the picker predicted. A short prompt is decode-only: no header. Both
// legs' bookings end.
func TestPickerPrefillDecode(t *testing.T) {
	f := startFleet(t, 4, vllmsim.Config{KVTransfer: &vllmsim.KVTransfer{Connector: "NixlConnector", Role: "kv_both"}})
	es := f.engines()
	es[0].Role, es[1].Role = config.RolePrefill, config.RolePrefill
	es[2].Role, es[3].Role = config.RoleDecode, config.RoleDecode
	var cars [2]*sidecar
	for i := range cars {
		var u string
		cars[i], u = startSidecar(t, es[2+i].URL)
		es[2+i].URL = u // the gateway reaches a decode pod through its sidecar
	}
	rt := startRouter(t, discovery.NewStatic(es), func(o *Options) { o.DisaggMinUncached = 64 })
	rt.waitStreams(t, "exact")
	gw, _ := startPicker(t, rt, false)
	ctx := context.Background()

	// The prefix is in the second prefill engine's cache: the prefill pick follows it.
	if a := postJSON(t, es[1].URL+"/v1/completions", idsPrompt(1, 192, 0, 0, 1)); a.status != 200 {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	testkit.WaitFor(t, waitBound, "the warmed blocks indexed", func() bool { return accuracyBlocks(rt, "e1") >= 12 })
	body := strings.Replace(idsPrompt(1, 192, 7, 40, 5), `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
	res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(body)})
	if err != nil || res.Status != 200 || !strings.Contains(string(res.ClientBody), "[DONE]") {
		t.Fatalf("split: %v %+v", err, res)
	}
	decode := res.Endpoints[0]
	if decode != hostOf(t, es[2].URL) && decode != hostOf(t, es[3].URL) {
		t.Fatalf("destination %s, want a decode pod (%s, %s)", decode, es[2].URL, es[3].URL)
	}
	for _, ep := range res.Endpoints[1:] {
		if ep == hostOf(t, es[0].URL) || ep == hostOf(t, es[1].URL) {
			t.Fatalf("a prefill engine %s among the fallbacks %v", ep, res.Endpoints)
		}
	}
	if got := res.SetHeaders.Get(PrefillHeader); got != hostOf(t, es[1].URL) {
		t.Fatalf("%s: %q, want the prefill engine holding the prefix, %s", PrefillHeader, got, hostOf(t, es[1].URL))
	}
	name, car := "e2", cars[0]
	if decode == hostOf(t, es[3].URL) {
		name, car = "e3", cars[1]
	}
	if p := car.prefilled(); len(p) != 1 || p[0] != hostOf(t, es[1].URL) {
		t.Fatalf("the sidecar's prefill legs went to %v", p)
	}
	testkit.WaitFor(t, waitBound, "both legs ended in the ledger", func() bool { return ledgerEmpty(rt) })
	testkit.WaitFor(t, waitBound, "the decode answer accounted", func() bool { return accuracyOf(rt, name).WithUsage == 1 })
	if acc := accuracyOf(rt, name); acc.PredictedCached != 231 || acc.ActualCached != 231 {
		t.Fatalf("decode engine %s: %+v, want predicted = reported = 231 (the pulled prompt less its last token)", name, acc)
	}
	// The prefill leg ended as answered; its answer was the sidecar's, so the accuracy counters
	// leave it out instead of reporting an engine without usage.
	if n := testutil.ToFloat64(rt.s.met.Requests.WithLabelValues("e1", rt.s.policy, "200")); n != 1 {
		t.Fatalf("prefill engine e1: %v answered legs, want 1", n)
	}
	if acc := accuracyOf(rt, "e1"); acc.Responses != 0 || acc.NoUsageSeen {
		t.Fatalf("prefill engine e1: %+v, want its sidecar-read answer left out of the accuracy", acc)
	}

	// A short prompt goes whole to a decode pod: no prefill header, the sidecar computes it
	// there.
	res, err = gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(idsPrompt(2, 20, 0, 0, 3))})
	if err != nil || res.Status != 200 || res.SetHeaders.Get(PrefillHeader) != "" {
		t.Fatalf("short prompt: %v %+v", err, res)
	}
	if res.Endpoints[0] != hostOf(t, es[2].URL) && res.Endpoints[0] != hostOf(t, es[3].URL) {
		t.Fatalf("short prompt picked %v, want a decode pod", res.Endpoints)
	}
	m := scrape(t, rt)
	for _, want := range []string{`kvroute_router_disagg_requests_total{path="split",reason=""} 1`,
		`kvroute_router_disagg_requests_total{path="decode_only",reason="short_prompt"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("missing %s:\n%s", want, grepLines(m, "disagg"))
		}
	}
	if n := len(cars[0].prefilled()) + len(cars[1].prefilled()); n != 1 {
		t.Errorf("%d prefill legs, want 1", n)
	}
	testkit.WaitFor(t, waitBound, "every booking ended", func() bool { return ledgerEmpty(rt) })
}

// accuracyBlocks is an engine's indexed blocks, all tiers.
func accuracyBlocks(rt *router, name string) int {
	for _, e := range rt.s.Engines() {
		if e.Name == name {
			n := 0
			for _, b := range e.Ranks[0].Blocks {
				n += b
			}
			return n
		}
	}
	return 0
}
