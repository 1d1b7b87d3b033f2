package app

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/admission"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// A model at zero replicas: the router stays ready, holds a request (on /metrics and
// /debug/engines) and answers it once a replica is discovered ready.
func TestHoldUntilReplicaReady(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	src := newPushSource(nil)
	rt := startRouter(t, src, func(o *Options) {
		o.Config.Hold = config.Hold{MaxWaiting: 4, MaxWait: metav1.Duration{Duration: time.Minute}}
	})
	testkit.WaitFor(t, waitBound, "/readyz 200 with no engine (the router holds)", func() bool {
		resp, err := http.Get(rt.api.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	got := make(chan answer, 1)
	go func() { got <- postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 2)) }()
	testkit.WaitFor(t, waitBound, "one request held on /metrics", func() bool { return modelGauges(t, rt)["held_requests"] == 1 })
	if st := debugHold(t, rt); st.Waiting != 1 || st.MaxWaiting != 4 || st.Outcomes[admission.OutcomeHeld] != 1 {
		t.Fatalf("/debug/engines hold: %+v", st)
	}
	select {
	case a := <-got:
		t.Fatalf("answered with no replica: %d %s", a.status, a.body)
	default:
	}
	src.ch <- []discovery.Engine{simEngine("e0", sim)}
	a := <-got
	if a.status != http.StatusOK || a.header.Get("x-kvroute-engine") != "e0" {
		t.Fatalf("after the scale-up: %d %s", a.status, a.body)
	}
	if st := debugHold(t, rt); st.Waiting != 0 || st.Outcomes[admission.OutcomeReleased] != 1 {
		t.Fatalf("/debug/engines hold after release: %+v", st)
	}
}

// Past the hold's wait the client gets 503 with Retry-After, counted as expired; with the hold
// full, at once, counted as full.
func TestHoldExpiresWith503(t *testing.T) {
	rt := startRouter(t, newPushSource(nil), func(o *Options) {
		o.Config.Hold = config.Hold{MaxWaiting: 1, MaxWait: metav1.Duration{Duration: 2 * time.Second}}
	})
	<-rt.s.Synced()
	first := make(chan answer, 1)
	go func() { first <- postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 2)) }()
	testkit.WaitFor(t, waitBound, "the first request held", func() bool { return rt.s.hold.Waiting() == 1 })
	full := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(2, 64, 0, 0, 2))
	if full.status != http.StatusServiceUnavailable || full.header.Get("Retry-After") != "1" {
		t.Fatalf("hold full: %d Retry-After %q %s", full.status, full.header.Get("Retry-After"), full.body)
	}
	a := <-first
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
		t.Fatalf("past the wait: %d Retry-After %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	if st := debugHold(t, rt); st.Outcomes[admission.OutcomeExpired] != 1 || st.Outcomes[admission.OutcomeFull] != 1 || st.Waiting != 0 {
		t.Fatalf("hold: %+v", st)
	}
}

func debugHold(t *testing.T, rt *router) admission.Stats {
	t.Helper()
	resp, err := http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct{ Hold admission.Stats }
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	return page.Hold
}

// Drain (kvrouter's SIGTERM): /readyz says why at once, while the API still answers.
func TestDrainNotReadyButServing(t *testing.T) {
	sim := startSim(t, vllmsim.Config{})
	rt := startRouter(t, newPushSource([]discovery.Engine{simEngine("e0", sim)}), nil)
	readyz := func() (int, string) {
		resp, err := http.Get(rt.api.URL + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testkit.WaitFor(t, waitBound, "/readyz 200", func() bool { c, _ := readyz(); return c == http.StatusOK })
	rt.s.Drain()
	if c, b := readyz(); c != http.StatusServiceUnavailable || !strings.Contains(b, ErrDraining) {
		t.Fatalf("/readyz after Drain: %d %s", c, b)
	}
	if a := postJSON(t, rt.api.URL+"/v1/completions", idsPrompt(1, 64, 0, 0, 2)); a.status != http.StatusOK {
		t.Fatalf("a request while draining: %d %s", a.status, a.body)
	}
}
