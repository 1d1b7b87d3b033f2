package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/audit"
	"github.com/kvroute/kvroute/router/capture"
	"github.com/kvroute/kvroute/router/load"
	"github.com/kvroute/kvroute/router/shadow"
)

// observers are the request observers the configuration enables: the trace capture, the
// prompt audit and the shadow policy, each adapted from the ledger's lifecycle (load.Observer,
// told when a routed request is done) to its own package's input.
type observers struct {
	list      []load.Observer
	rec       *capture.Recorder
	aud       *audit.Auditor
	shadowObs *shadowObserver
	// decode is the engine access the audit's shapes need; set by attach (the server is built
	// after the observers it is given).
	decode func(ctx context.Context, ids []uint32) (string, error)
}

func newObservers(st *settings) (*observers, error) {
	o := &observers{}
	if c := st.cfg.Capture; c != nil && c.Enabled {
		rec, err := capture.New(capture.Options{Dir: c.Dir, MaxBytes: c.MaxBytes, Files: c.Files, Logger: st.logger})
		if err != nil {
			return nil, err
		}
		o.rec = rec
		o.list = append(o.list, captureObserver(rec))
	}
	if a := st.cfg.Audit; a != nil && a.Enabled {
		// Shapes come from the engine's /detokenize of the varying span and a little context:
		// it is the text the engine saw, for chat and completion requests and for token-id
		// prompts alike, where the request body's text would need the chat template's offsets.
		o.aud = audit.New(audit.Options{SampleEvery: a.SampleEvery, ShowText: a.ShowText, Logger: st.logger,
			Decode: func(ctx context.Context, ids []uint32) (string, error) { return o.decode(ctx, ids) }})
		o.list = append(o.list, auditObserver(o.aud))
	}
	if st.cfg.ShadowPolicy != "" {
		// The policy is built by the server (its scoring knobs): attach fills it in.
		o.shadowObs = &shadowObserver{}
		o.list = append(o.list, o.shadowObs)
	}
	return o, nil
}

// attach registers the observers' metrics (and, for the audit, its engine access) on srv.
func (o *observers) attach(srv *app.Router, st *settings) error {
	var cs []prometheus.Collector
	if o.rec != nil {
		cs = append(cs, o.rec.Collectors()...)
		// Its drops are router-wide, so they are shown beside the engines, not in one of them.
		if err := srv.AddDebugSection("capture", func() any { return o.rec.Stats() }); err != nil {
			return err
		}
	}
	if o.aud != nil {
		o.decode = srv.Detokenize
		cs = append(cs, o.aud.Collectors()...)
	}
	if o.shadowObs != nil {
		pol, err := srv.NewPolicy(st.cfg.ShadowPolicy)
		if err != nil {
			return err
		}
		o.shadowObs.s = shadow.New(pol)
		// A policy that learns from first tokens (kvbench's kv-ttft) is told of them, as the
		// ledger tells the policy it serialises.
		o.shadowObs.learn, _ = pol.(load.Observer)
		cs = append(cs, o.shadowObs.s.Collectors()...)
	}
	for _, c := range cs {
		if err := srv.Metrics().Registry.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// admin adds /debug/audit to the admin handler (the admin port only: its patterns may hold
// prompt text when audit.showText is set).
func (o *observers) admin(h http.Handler) http.Handler {
	if o.aud == nil {
		return h
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/audit", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"sampled": o.aud.Sampled(), "patterns": o.aud.Patterns()})
	})
	mux.Handle("/", h)
	return mux
}

// close flushes the capture (after the servers stopped taking requests).
func (o *observers) close() {
	if o.rec != nil {
		_ = o.rec.Close()
	}
	if o.aud != nil {
		o.aud.Close()
	}
}

// done adapts load.Observer to the one call every observer here needs: the request's end.
type done func(r *load.Record, u *load.Usage)

func (f done) Routed(load.ID, *load.Record)                  {}
func (f done) FirstToken(load.ID, *load.Record, time.Time)   {}
func (f done) Failed(load.ID, *load.Record)                  {}
func (f done) Done(_ load.ID, r *load.Record, u *load.Usage) { f(r, u) }

func captureObserver(rec *capture.Recorder) load.Observer {
	return done(func(r *load.Record, u *load.Usage) {
		q := capture.Request{Arrival: r.At, Tokens: r.Tokens, Multimodal: r.Multimodal,
			Identity: capture.Identity{LoRA: r.Identity.LoRAName, CacheSalt: r.Identity.CacheSalt}}
		for _, c := range r.Cands {
			if c.Healthy {
				q.Replicas++
			}
		}
		if u != nil {
			q.OutputTokens = u.CompletionTokens
		}
		rec.Observe(q)
	})
}

func auditObserver(a *audit.Auditor) load.Observer {
	return done(func(r *load.Record, _ *load.Usage) {
		if !r.Multimodal { // media the token ids do not show: not a text lead
			a.Observe(r.Tokens)
		}
	})
}

// shadowObserver re-decides each request with the shadow policy when it is done; s (and learn,
// for a shadow policy that is an Observer) are set by attach, before the router takes requests.
type shadowObserver struct {
	s     *shadow.Shadow
	learn load.Observer
}

func (o *shadowObserver) Routed(load.ID, *load.Record) {}
func (o *shadowObserver) Failed(load.ID, *load.Record) {}

func (o *shadowObserver) FirstToken(id load.ID, r *load.Record, at time.Time) {
	if o.learn != nil {
		o.learn.FirstToken(id, r, at)
	}
}

func (o *shadowObserver) Done(_ load.ID, r *load.Record, _ *load.Usage) {
	if o.s != nil {
		o.s.Observe(r.Req, r.Cands, r.Chosen)
	}
}
