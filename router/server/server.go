// Package server is kvrouter's HTTP surface and nothing else: the OpenAI API (/v1/completions,
// /v1/chat/completions, /v1/models), /healthz and /readyz, and the admin port (/metrics,
// /debug/engines, /debug/route). It checks what HTTP decides (method, media type, body size and
// read time, the request deadline, whether the fleet is known yet) and hands the request to a
// Router (router/app), which tokenizes, decides and forwards. It imports none of the routing
// machinery (deps_test.go holds it to that).
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/router/proxy"
	"github.com/kvroute/kvroute/router/tokens"
)

// Router is what the HTTP surface serves.
type Router interface {
	// Synced is closed once the first engine snapshot is applied.
	Synced() <-chan struct{}
	// NotReady says why the router cannot take traffic ("" when it can).
	NotReady() string
	// Generate serves one generation request whose body passed the HTTP checks; ctx carries
	// the request deadline.
	Generate(ctx context.Context, w http.ResponseWriter, r *http.Request, kind tokens.Kind, body []byte)
	// Models serves GET /v1/models.
	Models(w http.ResponseWriter, r *http.Request)
	// StoredResponse serves GET /v1/responses/{id} and POST /v1/responses/{id}/cancel: the
	// engine that stored the response answers.
	StoredResponse(w http.ResponseWriter, r *http.Request)
	// DebugRoute serves POST /debug/route; DebugEngines GET /debug/engines.
	DebugRoute(w http.ResponseWriter, r *http.Request)
	DebugEngines(w http.ResponseWriter, r *http.Request)
	// MetricsHandler serves GET /metrics.
	MetricsHandler() http.Handler
	// Refused counts a request refused here, by reason (the errors counter on /metrics).
	Refused(reason string)
}

// Options are the HTTP limits (router/config's limits section).
type Options struct {
	MaxBodyBytes      int64
	BodyReadTimeout   time.Duration
	HeaderReadTimeout time.Duration
	// RequestTimeout bounds a generation request from its arrival to its last byte (0: none).
	RequestTimeout time.Duration
	// DiscoveryWait is how long a request that arrives before the first engine snapshot waits
	// for it before a 503 "no engine discovered yet".
	DiscoveryWait time.Duration
}

// Server is the HTTP surface of one Router.
type Server struct {
	rt Router
	o  Options
}

// New returns the HTTP surface of rt.
func New(rt Router, o Options) *Server {
	if o.DiscoveryWait <= 0 {
		o.DiscoveryWait = 10 * time.Second
	}
	return &Server{rt: rt, o: o}
}

// ErrNotDiscovered is the answer to a request that came before the first engine snapshot and
// waited for it in vain.
const ErrNotDiscovered = "no engine discovered yet"

// API serves the OpenAI API, /healthz and /readyz.
func (s *Server) API() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, tokens.Completion) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, tokens.Chat) })
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, tokens.Responses) })
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, tokens.Messages) })
	stored := func(w http.ResponseWriter, r *http.Request) {
		if s.awaitDiscovery(w, r) {
			s.rt.StoredResponse(w, r)
		}
	}
	mux.HandleFunc("GET /v1/responses/{id}", stored)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", stored)
	allowed := map[string]string{"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/responses": "POST",
		"/v1/messages": "POST", "/v1/models": "GET, HEAD", "/healthz": "GET, HEAD", "/readyz": "GET, HEAD"}
	for _, path := range PoolingPaths {
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) { s.serveGenerate(w, r, tokens.Pooling) })
		allowed[path] = "POST"
	}
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		if s.awaitDiscovery(w, r) {
			s.rt.Models(w, r)
		}
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeOK(w) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := s.rt.NotReady(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		writeOK(w)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow, ok := allowed[r.URL.Path]; ok {
			w.Header().Set("Allow", allow)
			proxy.WriteErrorFor(w, apiOf(r.URL.Path), http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on "+r.URL.Path)
			return
		}
		proxy.WriteError(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// PoolingPaths are the pinned vLLM's routes that reuse no KV cache (embeddings, pooling,
// classification, scores, rerank, tokenize, detokenize): forwarded by load, unkeyed.
var PoolingPaths = []string{"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank",
	"/v1/rerank", "/v2/rerank", "/tokenize", "/detokenize"}

// apiOf is the error dialect of a path: the Messages API's for /v1/messages.
func apiOf(path string) proxy.API {
	if path == "/v1/messages" {
		return proxy.APIMessages
	}
	return proxy.APIOpenAI
}

// writeOK answers a probe; a probe that left before reading it needs nothing more.
func writeOK(w http.ResponseWriter) { _, _ = w.Write([]byte("ok\n")) }

// Admin serves /metrics, /debug/engines and /debug/route.
func (s *Server) Admin() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.rt.MetricsHandler())
	mux.HandleFunc("GET /debug/engines", s.rt.DebugEngines)
	mux.HandleFunc("POST /debug/route", s.rt.DebugRoute)
	return mux
}

// Configure sets an API server's connection limits: limits.headerReadTimeout for a request's
// line and headers, and an idle keep-alive limit. There is no write timeout (it would cut long
// streams); bodies are bounded by limits.bodyReadTimeout in the handlers and by
// limits.maxBodyBytes.
func (s *Server) Configure(hs *http.Server) {
	hs.ReadHeaderTimeout = s.o.HeaderReadTimeout
	hs.IdleTimeout = 120 * time.Second
}

// acceptedKey holds, in a generation request's context, when the server took the request.
type acceptedKey struct{}

// Accepted is when the server took a generation request, before its body was read (the start
// of the router's request duration); the zero time when ctx did not come from the server.
func Accepted(ctx context.Context) time.Time {
	t, _ := ctx.Value(acceptedKey{}).(time.Time)
	return t
}

func (s *Server) serveGenerate(w http.ResponseWriter, r *http.Request, kind tokens.Kind) {
	accepted := time.Now()
	api := apiOf(r.URL.Path)
	if !s.awaitDiscovery(w, r) {
		return
	}
	if !jsonMediaType(r.Header.Get("Content-Type")) {
		// vLLM's generation routes depend on validate_json_request
		// (vllm/entrypoints/openai/api_server.py): the media type, lower-cased and without
		// parameters, must be application/json, or the request is a 400 validation error. A
		// `curl -d` body (application/x-www-form-urlencoded) or none at all is refused here
		// the same way, before a render call and a routing decision are spent on it.
		s.rt.Refused("bad_request")
		// vLLM's validation handler types it with the status phrase, "Bad Request".
		proxy.WriteErrorTyped(w, api, http.StatusBadRequest, http.StatusText(http.StatusBadRequest),
			"Unsupported Media Type: Only 'application/json' is allowed")
		return
	}
	ctx := context.WithValue(r.Context(), acceptedKey{}, accepted)
	if d := s.o.RequestTimeout; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, proxy.ErrRequestTimeout)
		defer cancel()
	}
	body, err := s.readBody(w, r)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.rt.Refused("body_timeout")
			w.Header().Set("Connection", "close")
			proxy.WriteErrorFor(w, api, http.StatusRequestTimeout,
				fmt.Sprintf("the request body did not arrive within %v", s.o.BodyReadTimeout))
			return
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			s.rt.Refused("too_large")
			proxy.WriteErrorFor(w, api, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("request body over %d bytes", mbe.Limit))
			return
		}
		proxy.WriteErrorFor(w, api, http.StatusBadRequest, "reading the body: "+err.Error())
		return
	}
	s.rt.Generate(ctx, w, r, kind, body)
}

// jsonMediaType reports whether a Content-Type is application/json (any parameters, any case).
func jsonMediaType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// awaitDiscovery holds a request that arrived before the first engine snapshot (the first
// milliseconds after start) until it is applied, rather than refusing it; false (after a 503
// "no engine discovered yet") when it does not come within the wait.
func (s *Server) awaitDiscovery(w http.ResponseWriter, r *http.Request) bool {
	select {
	case <-s.rt.Synced():
		return true
	default:
	}
	t := time.NewTimer(s.o.DiscoveryWait)
	defer t.Stop()
	select {
	case <-s.rt.Synced():
		return true
	case <-r.Context().Done():
		return false
	case <-t.C:
		s.rt.Refused("no_engine")
		proxy.WriteErrorFor(w, apiOf(r.URL.Path), http.StatusServiceUnavailable, ErrNotDiscovered)
		return false
	}
}

// readBody reads a request body within limits.bodyReadTimeout and limits.maxBodyBytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	deadline := false
	if d := s.o.BodyReadTimeout; d > 0 {
		deadline = rc.SetReadDeadline(time.Now().Add(d)) == nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.MaxBodyBytes))
	if deadline && err == nil {
		// Lifted once the body is in: a stream may last long after. On an error it stays, so
		// net/http does not wait for the rest of a slow body before closing the connection.
		if err := rc.SetReadDeadline(time.Time{}); err != nil {
			return nil, fmt.Errorf("lifting the body's read deadline: %w", err)
		}
	}
	return body, err
}
