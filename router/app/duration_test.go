package app

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// kvroute_router_request_duration_seconds counts each generation request once, under its
// outcome and whether it streamed: answered ones as ok, refused ones as client_error.
func TestRequestDurationByOutcome(t *testing.T) {
	f := startFleet(t, 1, vllmsim.Config{KVEventsPort: 0, KVReplayPort: 0})
	rt := startRouter(t, discovery.NewStatic(f.engines()), nil)
	rt.waitStreams(t, "exact")
	// counts reads every _count series of the histogram from /metrics, keyed outcome/stream.
	counts := func() map[string]uint64 {
		out := map[string]uint64{}
		for line := range strings.Lines(scrape(t, rt)) {
			var outcome, stream, n string
			rest, ok := strings.CutPrefix(line, `kvroute_router_request_duration_seconds_count{outcome="`)
			if !ok {
				continue
			}
			outcome, rest, _ = strings.Cut(rest, `",stream="`)
			stream, n, _ = strings.Cut(rest, `"} `)
			v, err := strconv.ParseUint(strings.TrimSpace(n), 10, 64)
			if err != nil {
				t.Fatalf("unparsable series %q: %v", line, err)
			}
			out[outcome+"/"+stream] = v
		}
		return out
	}

	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 2)); a.status != http.StatusOK {
		t.Fatalf("completion: %d %s", a.status, a.body)
	}
	stream := strings.Replace(idsPrompt(2, 64, 0, 0, 2), `{"model"`, `{"stream":true,"model"`, 1)
	if a := postJSON(t, rt.api.URL+"/v1/completions", stream); a.status != http.StatusOK {
		t.Fatalf("streamed completion: %d %s", a.status, a.body)
	}
	if a := postJSON(t, rt.api.URL+"/v1/completions", `{"model":"vllm-sim","prompt":`); a.status != http.StatusBadRequest {
		t.Fatalf("malformed body: %d %s, want 400", a.status, a.body)
	}
	want := map[string]uint64{"ok/false": 1, "ok/true": 1, "client_error/false": 1}
	// The duration is observed as the handler returns, which a client may see a moment before.
	var got map[string]uint64
	if !testkit.Until(waitBound, func() bool { got = counts(); return fmt.Sprint(got) == fmt.Sprint(want) }) {
		t.Fatalf("request_duration_seconds_count by outcome/stream = %v, want %v", got, want)
	}
}

// Every way an attempt ends maps to one outcome of the closed set.
func TestRequestOutcome(t *testing.T) {
	for _, c := range []struct {
		out  proxy.Outcome
		want string
	}{
		{proxy.Outcome{Status: 200, Phase: proxy.Answered}, outcomeOK},
		{proxy.Outcome{Status: 400, Phase: proxy.Answered}, outcomeClientError},
		{proxy.Outcome{Status: 503, Phase: proxy.Answered}, outcomeEngineError},
		{proxy.Outcome{Status: 200, Phase: proxy.Answered, EngineError: "boom"}, outcomeEngineError},
		{proxy.Outcome{Status: 200, Phase: proxy.Cut, Kind: proxy.KindReset, Err: errors.New("reset")}, outcomeEngineError},
		{proxy.Outcome{Kind: proxy.KindConnect, Err: errors.New("refused")}, outcomeEngineError},
		{proxy.Outcome{Phase: proxy.Failed, Kind: proxy.KindRequestTimeout, Err: proxy.ErrRequestTimeout}, outcomeTimeout},
		{proxy.Outcome{Status: 200, Phase: proxy.Cut, Kind: proxy.KindIdleTimeout, Err: proxy.ErrIdleTimeout}, outcomeTimeout},
		{proxy.Outcome{Kind: proxy.KindFirstTokenTimeout, Err: proxy.ErrFirstTokenTimeout}, outcomeTimeout},
		{proxy.Outcome{Status: 200, Phase: proxy.Cut, Kind: proxy.KindClientGone, Err: errors.New("canceled")}, outcomeCanceled},
	} {
		if got := requestOutcome(c.out); got != c.want {
			t.Errorf("requestOutcome(%+v) = %s, want %s", c.out, got, c.want)
		}
	}
}
