package main

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router/audit"
	"github.com/kvroute/kvroute/router/capture"
	"github.com/kvroute/kvroute/router/server"
	"github.com/kvroute/kvroute/router/shadow"
)

// observers are the request observers the configuration enables: the trace capture and the
// prompt audit, each adapted from the server's RequestDone to its own package's input (the
// one place to re-point when the server's seam moves).
type observers struct {
	list      []server.RequestObserver
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
		o.list = append(o.list, captureObserver{rec})
	}
	if a := st.cfg.Audit; a != nil && a.Enabled {
		// Shapes come from the engine's /detokenize of the varying span and a little context:
		// it is the text the engine saw, for chat and completion requests and for token-id
		// prompts alike, where the request body's text would need the chat template's offsets.
		o.aud = audit.New(audit.Options{SampleEvery: a.SampleEvery, ShowText: a.ShowText, Logger: st.logger,
			Decode: func(ctx context.Context, ids []uint32) (string, error) { return o.decode(ctx, ids) }})
		o.list = append(o.list, auditObserver{o.aud})
	}
	if st.cfg.ShadowPolicy != "" {
		// The policy is built by the server (its scoring knobs): attach fills it in.
		o.shadowObs = &shadowObserver{}
		o.list = append(o.list, o.shadowObs)
	}
	return o, nil
}

// attach registers the observers' metrics (and, for the audit, its engine access) on srv.
func (o *observers) attach(srv *server.Server, st *settings) error {
	var cs []prometheus.Collector
	if o.rec != nil {
		cs = append(cs, o.rec.Collectors()...)
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

type auditObserver struct{ a *audit.Auditor }

func (a auditObserver) RequestDone(d *server.RequestDone) {
	if d.Multimodal {
		return // media the token ids do not show: not a text lead
	}
	a.a.Observe(d.Tokens)
}

type captureObserver struct{ r *capture.Recorder }

func (c captureObserver) RequestDone(d *server.RequestDone) {
	q := capture.Request{Arrival: d.Arrival, Tokens: d.Tokens, Multimodal: d.Multimodal,
		Identity: capture.Identity{LoRA: d.Identity.LoRAName, CacheSalt: d.Identity.CacheSalt}}
	if d.Usage != nil {
		q.OutputTokens = d.Usage.CompletionTokens
	}
	c.r.Observe(q)
}

// shadowObserver re-decides each request with the shadow policy; s is set by attach, before
// the server takes requests.
type shadowObserver struct{ s *shadow.Shadow }

func (o *shadowObserver) RequestDone(d *server.RequestDone) {
	if o.s == nil || d.Decision == nil {
		return
	}
	o.s.Observe(d.Decision.Request, d.Decision.Candidates, d.Decision.Chosen)
}
