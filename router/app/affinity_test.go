package app

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/discovery"
	"github.com/kvroute/kvroute/router/kvevents/kvtest"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// turnBody is turn k (from 0) of conversation c: the conversation's first 96 tokens plus 64 more
// per turn, so every turn's prompt extends the previous one's, as a chat history does.
func turnBody(c, k int) string {
	var b strings.Builder
	b.WriteString(`{"model":"vllm-sim","max_tokens":1,"prompt":[`)
	for i := range 96 + 64*k {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, 1000+(c*104729+i*31)%100000)
	}
	b.WriteString(`]}`)
	return b.String()
}

// A conversation's next turn goes to its last turn's replica before that turn's blocks are
// announced: the engines' event streams are up but say nothing
// for the whole test, so only what the router predicted from its own decisions (the ledger's
// side index) can keep the turns together. Six conversations of five turns, interleaved, over
// three engines: under kv every turn follows its first; under load (the contrast, which keeps
// no prediction) some conversation moves, so the assertion can fail.
func TestConversationTurnsStayBeforeEventsArrive(t *testing.T) {
	const convs, turns = 6, 5
	run := func(policy string) (moved int, firsts map[string]int) {
		f := startFleet(t, 3, vllmsim.Config{})
		es := f.engines()
		var pubs []*kvtest.Publisher
		for i := range es {
			u, _ := url.Parse(es[i].URL)
			p, err := kvtest.NewPublisher(kvtest.Options{Topic: "kv@" + u.Host + "@vllm-sim"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			// The engine's own stream is replaced by one that stays silent: every event is late.
			es[i].Events, es[i].Replay = []string{p.Endpoint()}, []string{p.ReplayEndpoint()}
			pubs = append(pubs, p)
		}
		rt := startRouter(t, discovery.NewStatic(es), func(o *Options) { o.Config.Policy = policy })
		for _, p := range pubs {
			if err := p.WaitSubscribers(1, 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		rt.waitStreams(t, "exact")
		first := make([]string, convs)
		firsts = map[string]int{}
		for k := range turns {
			for c := range convs {
				a := postJSON(t, rt.api.URL+"/v1/completions", turnBody(c, k))
				if a.status != 200 {
					t.Fatalf("%s: conversation %d turn %d: %d %s", policy, c, k, a.status, a.body)
				}
				e := a.header.Get("x-kvroute-engine")
				switch {
				case k == 0:
					first[c] = e
					firsts[e]++
				case e != first[c]:
					moved++
				}
			}
		}
		for i, r := range rt.s.reps() {
			if st, ok := rt.s.sub.Stats(r.Eng.Name, r.Rank); ok && st.Applied != 0 {
				t.Fatalf("replica %d applied %d batches; the test needs every event late", i, st.Applied)
			}
		}
		return moved, firsts
	}
	moved, firsts := run("kv")
	if moved != 0 {
		t.Errorf("kv: %d of %d later turns left their conversation's replica (first turns %v)", moved, convs*(turns-1), firsts)
	}
	if len(firsts) < 2 {
		t.Errorf("kv: every conversation started on one replica %v; affinity should not cost the spread", firsts)
	}
	lm, _ := run("load")
	t.Logf("later turns that moved: kv %d, load %d of %d; kv's first turns %v", moved, lm, convs*(turns-1), firsts)
	if lm == 0 {
		t.Errorf("load kept every turn together too: the test cannot tell affinity from chance")
	}
}
