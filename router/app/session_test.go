package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/router/kvwire"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// The engines' BlockStored session_id decides where a session goes when the overlap does not:
// three engines all hold the prompt's prefix (every replica costs the same uncached tokens), and
// each engine announced one session's blocks. Every request of a session then goes to the
// engine that stored for it, through the real event path (ZMQ, msgpack, the ingester, the
// index's session map) and the pipeline's one decision. Without the session's events the pick
// among three equal replicas is the policy's tie-break: 12 requests homed by chance is (1/3)^12.
// /debug/engines shows the session map.
func TestSessionHomeFromEventsDecidesATie(t *testing.T) {
	const engines, perSession = 3, 4
	algo, _ := blockkey.ParseAlgo("sha256")
	var es []discovery.Engine
	var pubs []*kvtest.Publisher
	var caches []*kvtest.Cache
	for i := range engines {
		sim := startSim(t, vllmsim.Config{Model: "m"})
		u, _ := url.Parse(sim.URL())
		pub, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@" + u.Host + "@m", NoReplay: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		cache, err := kvtest.NewCache(algo, "0", 16)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, discovery.Engine{Name: fmt.Sprintf("e%d", i), URL: sim.URL(), Events: []string{pub.Endpoint()}, Ready: true})
		pubs, caches = append(pubs, pub), append(caches, cache)
	}
	rt := startRouter(t, discovery.NewStatic(es), func(o *Options) {
		noHealthLoop(o)
		o.Model = "m"
	})
	for i, pub := range pubs {
		if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, waitBound, "a first batch applied", func() bool {
			_, _ = pub.Publish(caches[i].Clear())
			st, _ := rt.s.sub.Stats(es[i].Name, 0)
			return st.Applied > 0
		})
	}
	// The shared prefix, 64 tokens (4 blocks), on every engine; each engine's session blocks
	// are tokens no request sends.
	prompt := make([]uint32, 64)
	for j := range prompt {
		prompt[j] = uint32(500 + j)
	}
	for i, pub := range pubs {
		ev, err := caches[i].Store(prompt, 0)
		if err != nil {
			t.Fatal(err)
		}
		own := make([]uint32, 32)
		for j := range own {
			own[j] = uint32(9000 + 100*i + j)
		}
		sess, err := caches[i].Store(own, 0)
		if err != nil {
			t.Fatal(err)
		}
		sess.Stored.SessionID = kvwire.Some(fmt.Sprintf("conv-%d", i))
		if _, err := pub.Publish(ev, sess); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, waitBound, "every engine's session learnt", func() bool {
		return rt.s.ix.SessionStats().Sessions == engines
	})
	ids := make([]string, len(prompt))
	for j, tok := range prompt {
		ids[j] = fmt.Sprint(tok)
	}
	body := func(user string) string {
		return `{"model":"m","max_tokens":1,"user":"` + user + `","prompt":[` + strings.Join(ids, ",") + `]}`
	}
	// Interleaved, so no session's turns run back to back.
	for range perSession {
		for i := range engines {
			a := postJSON(t, rt.api.URL+"/v1/completions", body(fmt.Sprintf("conv-%d", i)))
			if a.status != http.StatusOK {
				t.Fatalf("conv-%d: %d %s", i, a.status, a.body)
			}
			if got := a.header.Get("x-kvroute-engine"); got != es[i].Name {
				t.Errorf("conv-%d went to %s; its blocks were stored on %s", i, got, es[i].Name)
			}
		}
	}
	resp, err := http.Get(rt.admin.URL + "/debug/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dbg struct {
		Sessions struct {
			Sessions int    `json:"sessions"`
			Max      int    `json:"max"`
			Noted    uint64 `json:"noted"`
		} `json:"sessions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&dbg); err != nil {
		t.Fatal(err)
	}
	if dbg.Sessions.Sessions != engines || dbg.Sessions.Max <= 0 || dbg.Sessions.Noted < engines {
		t.Errorf("/debug/engines sessions = %+v, want %d sessions", dbg.Sessions, engines)
	}
}
