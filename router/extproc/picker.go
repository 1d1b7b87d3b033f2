// Package extproc serves the Gateway API Inference Extension's endpoint picker protocol: an
// Envoy ext_proc (envoy.service.ext_proc.v3) gRPC server that reads an inference request as a
// gateway streams it, asks a Picker for the endpoint, answers with the pick (header and dynamic
// metadata), and follows the response to learn its first token, usage and end.
//
// The protocol is the Inference Extension's "Endpoint Picker Protocol" (its
// docs/proposals/004-endpoint-picker-protocol/README.md, v1.0.0): the subset hint in filter
// metadata envoy.lb.subset_hint, the pick as x-gateway-destination-endpoint plus envoy.lb dynamic
// metadata, 503 when nothing is eligible, 429 to shed, the served endpoint back in
// metadata_context, and the gRPC health services liveness, readiness and the ext_proc service.
//
// The package knows nothing of how a pick is made: it drives the Picker interface below, which
// the router implements over its request pipeline.
package extproc

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/router/proxy"
)

// Request is what the picker knows of one inference request when it has read it whole.
type Request struct {
	Method string
	// Path is the request's :path without its query (e.g. /v1/chat/completions); Query is the
	// part after "?".
	Path   string
	Query  string
	Header http.Header
	Body   []byte
}

// Subset restricts a pick to some endpoints: the gateway's subset hint or, with conformance
// hooks on, the test-epp-endpoint-selection header. An entry is ip:port or a bare ip (every
// port of that address).
type Subset struct {
	// Set: a restriction applies; Endpoints empty then means nothing is eligible.
	Set       bool
	Endpoints []string
}

// Refusal is a client-facing answer the picker gives instead of a pick (a bad request, an
// engine's own refusal): status and an OpenAI-shaped JSON body.
type Refusal struct {
	Status int
	Body   []byte
}

// Prepared is a request read and keyed, ready to be picked for.
type Prepared interface {
	// Stream reports whether the answer is an SSE stream.
	Stream() bool
	// Body is the body to send upstream: the client's, or a rewrite (nil: unchanged).
	Body() []byte
	// DropUsageChunk: the picker asked the engine for usage the client did not; the stream's
	// usage-only final chunk is the picker's, not the client's.
	DropUsageChunk() bool
	// API is the answer's dialect (OpenAI's chunks, the Responses or Messages API's typed
	// events), which the response phases are read in.
	API() proxy.API
}

// Picker decides where requests go and learns how they went.
type Picker interface {
	// Prepare parses and keys a request; a refusal answers the client instead.
	Prepare(ctx context.Context, r *Request) (Prepared, *Refusal)
	// Pick books the request on an endpoint within subset: ErrNoEndpoint (503) when none is
	// eligible, ErrShed (429) to drop it.
	Pick(ctx context.Context, p Prepared, subset Subset) (Booking, error)
}

// ErrNoEndpoint and ErrShed are Pick's refusals.
var (
	ErrNoEndpoint = errors.New("no eligible endpoint")
	ErrShed       = errors.New("request shed")
)

// Booking is one picked request, in flight until End.
type Booking interface {
	// Endpoints is the pick, ip:port, best first; the rest are the fallbacks a gateway tries in
	// order when the first fails.
	Endpoints() []string
	// Headers are request headers to set upstream (e.g. the DP rank to pin).
	Headers() map[string]string
	// Served tells the booking which endpoint the gateway actually used (a fallback when the
	// first failed); called at most once, before FirstToken.
	Served(endpoint string)
	// FirstToken: the first token is on its way to the client.
	FirstToken()
	// End: the request is over; called exactly once.
	End(res Result)
}

// Phase is how far a request got.
type Phase int

const (
	// Unsent: the gateway never reported a response (it could not reach any endpoint, or the
	// stream ended before the response headers).
	Unsent Phase = iota
	// Refused: the engine answered with an error status.
	Refused
	// Complete: the answer ended normally.
	Complete
	// Cut: a started answer broke off (an error event, the stream ended without its end).
	Cut
	// Abandoned: the client or the gateway went away.
	Abandoned
)

// String names the phase (a metrics label).
func (p Phase) String() string {
	switch p {
	case Unsent:
		return "unsent"
	case Refused:
		return "refused"
	case Complete:
		return "complete"
	case Cut:
		return "cut"
	case Abandoned:
		return "abandoned"
	}
	return "unknown"
}

// Usage is the engine's reported usage, read from the response as the proxy reads it.
type Usage = proxy.Usage

// Result is how one booked request ended.
type Result struct {
	Phase  Phase
	Status int
	// Served is the endpoint the gateway reported it used ("" when it did not say).
	Served string
	Usage  *Usage
	// HeadersAfter is the time from the pick to the response headers (0: none came).
	HeadersAfter time.Duration
	// TTFT is the time from the pick to the first token (0: none came).
	TTFT time.Duration
	// EngineError is the message of an in-stream error event.
	EngineError string
	// Reason says why a request did not complete (a timeout, the stream's error).
	Reason string
	// ResponseID is a Responses answer's id (its body's, or the stream's response.created).
	ResponseID string
}
