package main

import (
	"github.com/kvroute/kvroute/router/capture"
	"github.com/kvroute/kvroute/router/server"
)

// observers are the request observers the configuration enables: the trace capture and the
// prompt audit, each adapted from the server's RequestDone to its own package's input (the
// one place to re-point when the server's seam moves).
type observers struct {
	list []server.RequestObserver
	rec  *capture.Recorder
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
	return o, nil
}

// attach registers the observers' metrics (and, for the audit, its engine access) on srv.
func (o *observers) attach(srv *server.Server) error {
	if o.rec != nil {
		for _, c := range o.rec.Collectors() {
			if err := srv.Metrics().Registry.Register(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// close flushes the capture (after the servers stopped taking requests).
func (o *observers) close() {
	if o.rec != nil {
		_ = o.rec.Close()
	}
}

type captureObserver struct{ r *capture.Recorder }

func (c captureObserver) RequestDone(d *server.RequestDone) {
	q := capture.Request{Arrival: d.Arrival, Tokens: d.Tokens,
		Identity: capture.Identity{LoRA: d.Identity.LoRAName, CacheSalt: d.Identity.CacheSalt}}
	if d.Usage != nil {
		q.OutputTokens = d.Usage.CompletionTokens
	}
	c.r.Observe(q)
}
