package app

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/kvroute/kvroute/router/proxy"
)

// vLLM keeps a stored Responses answer in the memory of the API server that produced it
// (vllm/entrypoints/openai/responses/serving.py: response_store, msg_store), so a follow-up
// naming it in previous_response_id, a GET of it and its cancel must reach that engine. The
// router learns each stored response's id from the answer (the body's id, the stream's
// response.created) and keeps id -> engine in a bounded map with a TTL; an id it does not know
// (another router replica routed it, or this one restarted) is looked up by asking the engines.

const (
	// responseProbeTimeout bounds each engine's GET /v1/responses/{id} when looking up an id.
	responseProbeTimeout = 2 * time.Second
)

// Results of kvroute_router_response_affinity_total.
const (
	affinityRecorded    = "recorded"          // a stored response's owner learnt from its answer
	affinityPinned      = "pinned"            // a request sent to the engine holding its response
	affinityProbed      = "found_by_lookup"   // the owner found by asking the engines
	affinityNotFound    = "not_found"         // no engine holds it: 404, as vLLM answers
	affinityUnavailable = "owner_unavailable" // the owner is gone or unhealthy: 404 rather than elsewhere
)

// responseOwners maps stored response ids to the engine (its name) that holds them.
type responseOwners struct {
	m *expirable.LRU[string, string]
}

// newResponseOwners bounds the map at size ids, each kept for ttl (config.Responses).
func newResponseOwners(size int, ttl time.Duration, evicted func()) *responseOwners {
	return &responseOwners{m: expirable.NewLRU(size, func(string, string) { evicted() }, ttl)}
}

func (o *responseOwners) add(id, engine string) { o.m.Add(id, engine) }

func (o *responseOwners) get(id string) (string, bool) { return o.m.Get(id) }

// responseNotFound is vLLM's answer for a response id its store does not hold
// (_make_not_found_error in vllm/entrypoints/openai/responses/serving.py).
func responseNotFound(id string) *refusal {
	param := "response_id"
	return &refusal{status: http.StatusNotFound, detail: &proxy.ErrorDetail{Type: proxy.TypeInvalidRequest,
		Message: "Response with id '" + id + "' not found.", Param: &param}}
}

// responseOwner finds the engine holding response id: the map, else the engines asked in turn.
// A refusal (vLLM's 404) when none can serve it: the owner is gone or unhealthy, or no engine
// holds it. The request never goes elsewhere: another engine would answer the same 404, or
// worse, continue a conversation it does not have.
func (s *Router) responseOwner(ctx context.Context, hdr http.Header, id string) (*engine, *refusal) {
	now := s.now()
	if name, ok := s.respOwners.get(id); ok {
		for _, rep := range s.reps() {
			e := rep.Eng
			if e.Name == name && !e.Gone() && e.Discovery().Ready && e.Health.Healthy(now) {
				s.met.ResponseAffinity.WithLabelValues(affinityPinned).Inc()
				return e, nil
			}
		}
		s.met.ResponseAffinity.WithLabelValues(affinityUnavailable).Inc()
		s.logLimited("response-owner:"+name, "a stored response's engine is gone or unhealthy; answering 404 rather than sending it elsewhere, counted in kvroute_router_response_affinity_total",
			"engine", name)
		return nil, responseNotFound(id)
	}
	if e := s.lookupResponse(ctx, hdr, id); e != nil {
		s.met.ResponseAffinity.WithLabelValues(affinityProbed).Inc()
		s.met.ResponseAffinity.WithLabelValues(affinityPinned).Inc()
		s.respOwners.add(id, e.Name)
		return e, nil
	}
	s.met.ResponseAffinity.WithLabelValues(affinityNotFound).Inc()
	return nil, responseNotFound(id)
}

// lookupResponse asks each healthy engine for response id (GET /v1/responses/{id}) and returns
// the first that holds it, nil when none does.
func (s *Router) lookupResponse(ctx context.Context, hdr http.Header, id string) *engine {
	now := s.now()
	for _, rep := range s.reps() {
		e := rep.Eng
		if rep.Rank != 0 || e.Gone() || !e.Discovery().Ready || !e.Health.Healthy(now) {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, responseProbeTimeout)
		req, err := http.NewRequestWithContext(pctx, http.MethodGet, e.Discovery().URL+"/v1/responses/"+url.PathEscape(id), nil)
		if err == nil {
			if a := hdr.Get("Authorization"); a != "" {
				req.Header.Set("Authorization", a)
			}
			var resp *http.Response
			if resp, err = s.px.Client().Do(req); err == nil {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					cancel()
					return e
				}
			}
		}
		cancel()
	}
	return nil
}

// recordResponse remembers which engine stored a Responses answer.
func (s *Router) recordResponse(id string, e *engine) {
	if id == "" {
		return
	}
	s.respOwners.add(id, e.Name)
	s.met.ResponseAffinity.WithLabelValues(affinityRecorded).Inc()
}

// StoredResponse serves GET /v1/responses/{id} and POST /v1/responses/{id}/cancel
// (server.Router): forwarded to the engine holding the response, its answer (a stream for
// GET ?stream=true) passed through.
func (s *Router) StoredResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	owner, ref := s.responseOwner(r.Context(), r.Header, id)
	if ref != nil {
		ref.write(w)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, owner.Discovery().URL+r.URL.RequestURI(), nil)
	if err != nil {
		proxy.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	for _, k := range []string{"Authorization", "Accept", "X-Request-Id"} {
		if v := r.Header.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := s.px.Client().Do(req)
	if err != nil {
		s.fleet.AttemptFailed(owner, err.Error(), false)
		proxy.WriteError(w, http.StatusBadGateway, "engine "+owner.Name+": "+err.Error())
		return
	}
	defer resp.Body.Close()
	for _, k := range []string{"Content-Type", "Cache-Control"} {
		if v := resp.Header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.Header().Set("x-kvroute-engine", owner.Name)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}
