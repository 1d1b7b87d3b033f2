package extproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The protocol's names (the Endpoint Picker Protocol, v1.0.0).
const (
	// DestinationHeader carries the pick: ip:port[,ip:port...], best first.
	DestinationHeader = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of the pick and of the served endpoint.
	MetadataNamespace = "envoy.lb"
	// ServedKey is the served endpoint in metadata_context[MetadataNamespace].
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey are the gateway's subset hint in filter metadata.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// TestSelectionHeader and TestServedHeader are the Inference Extension conformance suite's
	// hooks: the suite names the endpoints a request may go to, and reads back the one that
	// served it.
	TestSelectionHeader = "test-epp-endpoint-selection"
	TestServedHeader    = "x-conformance-test-served-endpoint"
	// ServiceName is the ext_proc gRPC service (also a health service name).
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
	// ChunkLimit bounds one streamed body message the picker sends: some gateways cap a
	// streamed chunk at 64 KiB, so bodies go back in pieces with a margin under it.
	ChunkLimit = 62000
)

// Options configure a Server.
type Options struct {
	// MaxBodyBytes bounds a request body the picker holds to read it (413 past it), and a
	// non-streamed answer it holds to read its usage (past it: passed on, usage unread, counted).
	MaxBodyBytes int
	// BodyTimeout bounds the time from the request headers to the pick.
	BodyTimeout time.Duration
	// StreamTimeout bounds one request's whole ext_proc stream.
	StreamTimeout time.Duration
	// ConformanceHooks honours TestSelectionHeader and echoes TestServedHeader: for the
	// Inference Extension's conformance suite only (a client could steer its requests).
	ConformanceHooks bool
	Logger           *slog.Logger
	// Registerer takes the server's metrics (nil: unregistered).
	Registerer prometheus.Registerer
}

func (o *Options) defaults() {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 32 << 20
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = time.Minute
	}
	if o.StreamTimeout <= 0 {
		o.StreamTimeout = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server is the endpoint picker's ext_proc service and its gRPC health services.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	picker Picker
	o      Options
	met    *metrics
	health *health.Server

	logMu   sync.Mutex
	logLast map[string]time.Time
}

// New builds a Server for a picker; it starts not ready (SetReady).
func New(p Picker, o Options) *Server {
	o.defaults()
	s := &Server{picker: p, o: o, met: newMetrics(o.Registerer), health: health.NewServer(), logLast: map[string]time.Time{}}
	s.health.SetServingStatus("liveness", healthpb.HealthCheckResponse_SERVING)
	s.SetReady(false)
	return s
}

// Register puts the ext_proc and health services on a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// SetReady sets the readiness services ("", readiness and the ext_proc service): ready when
// the picker has engines to pick from.
func (s *Server) SetReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", "readiness", ServiceName} {
		s.health.SetServingStatus(name, st)
	}
}

// Shutdown marks every service not serving (a draining picker).
func (s *Server) Shutdown() { s.health.Shutdown() }

// logLimited logs a reason at most once a minute (its count is on /metrics).
func (s *Server) logLimited(reason, msg string, args ...any) {
	now := time.Now()
	s.logMu.Lock()
	last, seen := s.logLast[reason]
	if seen && now.Sub(last) < time.Minute {
		s.logMu.Unlock()
		return
	}
	s.logLast[reason] = now
	s.logMu.Unlock()
	s.o.Logger.Warn(msg, append(args, "reason", reason)...)
}

// Process serves one HTTP request's ext_proc stream.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	ctx, cancel := context.WithTimeout(srv.Context(), s.o.StreamTimeout)
	defer cancel()
	s.met.active.Inc()
	defer s.met.active.Dec()
	st := &stream{s: s, srv: srv, ctx: ctx, start: time.Now()}
	defer st.finish()

	msgs := make(chan *extprocv3.ProcessingRequest)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := srv.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	bodyTimer := time.NewTimer(s.o.BodyTimeout)
	defer bodyTimer.Stop()
	for {
		select {
		case m := <-msgs:
			done, err := st.handle(m)
			if err != nil || done {
				return err
			}
			if st.booking != nil || st.answered {
				bodyTimer.Stop()
			}
		case err := <-errc:
			return st.recvEnded(err)
		case <-bodyTimer.C:
			if st.booking == nil && !st.answered {
				s.met.errors.WithLabelValues("body_timeout").Inc()
				s.logLimited("body_timeout", "request body did not arrive within the body timeout; answered 408, counted in kvroute_router_extproc_errors_total")
				return st.immediate(http.StatusRequestTimeout, "invalid_request_error", "the request body did not arrive within "+s.o.BodyTimeout.String(), "body_timeout")
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) && srv.Context().Err() == nil {
				s.met.errors.WithLabelValues("stream_timeout").Inc()
				s.logLimited("stream_timeout", "ext_proc stream outlived the stream timeout; closed, counted in kvroute_router_extproc_errors_total")
				st.reason = "stream_timeout"
				return status.Error(codes.DeadlineExceeded, "ext_proc stream timeout")
			}
			st.reason = "gateway_gone"
			return nil
		}
	}
}

// stream is one request's state.
type stream struct {
	s     *Server
	srv   extprocv3.ExternalProcessor_ProcessServer
	ctx   context.Context
	start time.Time

	reqMode  filterv3.ProcessingMode_BodySendMode
	respMode filterv3.ProcessingMode_BodySendMode
	modeSeen bool

	req      Request
	subset   Subset
	body     []byte
	prepared Prepared
	booking  Booking
	picked   time.Time
	answered bool // an immediate response went out

	respStatus int
	respAt     time.Time
	served     string
	watch      watcher
	firstAt    time.Time
	ended      bool
	reason     string
}

// handle answers one gateway message; done: the exchange is over.
func (st *stream) handle(m *extprocv3.ProcessingRequest) (bool, error) {
	if !st.modeSeen {
		st.modeSeen = true
		st.reqMode, st.respMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		if pc := m.GetProtocolConfig(); pc != nil {
			st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		}
	}
	switch v := m.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(m, v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return st.responseHeaders(m, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

// buffered reports whether the gateway waits for each answer before sending on (the request
// headers' answer before the body): the pick then rides on the body's answer.
func (st *stream) buffered() bool {
	return st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL
}

func (st *stream) requestHeaders(m *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	st.req.Header = http.Header{}
	for _, hv := range h.GetHeaders().GetHeaders() {
		val := headerValue(hv)
		switch hv.GetKey() {
		case ":path":
			st.req.Path = val
		case ":method":
			st.req.Method = val
		}
		if !strings.HasPrefix(hv.GetKey(), ":") {
			st.req.Header.Add(hv.GetKey(), val)
		}
	}
	if p, q, ok := strings.Cut(st.req.Path, "?"); ok {
		st.req.Path, st.req.Query = p, q
	}
	st.subset = subsetHint(m.GetMetadataContext())
	if st.s.o.ConformanceHooks {
		if v := st.req.Header.Get(TestSelectionHeader); v != "" {
			st.subset = Subset{Set: true, Endpoints: splitList(v)}
		}
	}
	if h.GetEndOfStream() {
		return st.pick(false)
	}
	if st.buffered() {
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
	}
	return false, nil // the answer waits for the body: it carries the pick
}

func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.booking != nil || st.answered {
		st.s.met.errors.WithLabelValues("protocol").Inc()
		return true, status.Error(codes.FailedPrecondition, "request body after the request was picked for")
	}
	if len(st.body)+len(b.GetBody()) > st.s.o.MaxBodyBytes {
		st.s.met.errors.WithLabelValues("body_too_large").Inc()
		st.s.logLimited("body_too_large", "request body over the picker's limit; answered 413, counted in kvroute_router_extproc_errors_total",
			"limit", st.s.o.MaxBodyBytes)
		return true, st.immediate(http.StatusRequestEntityTooLarge, "invalid_request_error",
			"the request body is over the endpoint picker's limit of "+strconv.Itoa(st.s.o.MaxBodyBytes)+" bytes", "body_too_large")
	}
	st.body = append(st.body, b.GetBody()...)
	if !b.GetEndOfStream() {
		if st.buffered() {
			// BUFFERED_PARTIAL sends what fit; the gateway still waits for an answer.
			return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}})
		}
		return false, nil
	}
	return st.pick(true)
}

// pick prepares and books the request, then answers the gateway with the pick (or refuses).
func (st *stream) pick(hasBody bool) (bool, error) {
	st.req.Body = st.body
	p, ref := st.s.picker.Prepare(st.ctx, &st.req)
	if ref != nil {
		st.s.met.immediate.WithLabelValues(strconv.Itoa(ref.Status), "refused").Inc()
		st.answered = true
		return true, st.send(immediateResponse(ref.Status, ref.Body))
	}
	st.prepared = p
	b, err := st.s.picker.Pick(st.ctx, p, st.subset)
	switch {
	case errors.Is(err, ErrShed):
		return true, st.immediate(http.StatusTooManyRequests, "rate_limit_error", "the endpoint picker shed this request: "+err.Error(), "shed")
	case err != nil:
		msg := "no eligible endpoint"
		reason := "no_endpoint"
		if st.subset.Set {
			msg += " in the gateway's subset (" + strconv.Itoa(len(st.subset.Endpoints)) + " endpoints named)"
			reason = "no_endpoint_in_subset"
		}
		return true, st.immediate(http.StatusServiceUnavailable, "service_unavailable", msg, reason)
	}
	st.booking, st.picked = b, time.Now()
	st.watch = watcher{stream: p.Stream(), api: p.API(), dropUse: p.DropUsageChunk(), maxBody: st.s.o.MaxBodyBytes}
	eps := strings.Join(b.Endpoints(), ",")
	common := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: st.pickHeaders(eps, b.Headers())}
	meta := pickMetadata(eps)
	body := p.Body()
	if body == nil {
		body = st.body
	}
	st.body = nil
	st.s.met.pickSeconds.Observe(time.Since(st.start).Seconds())
	if !hasBody || st.buffered() {
		if hasBody && p.Body() != nil {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
		}
		resp := &extprocv3.ProcessingResponse{DynamicMetadata: meta}
		if hasBody {
			resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
		} else {
			resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
		}
		if err := st.send(resp); err != nil {
			st.end(Unsent, "send_failed")
			return true, err
		}
		return false, nil
	}
	// Full duplex: the headers' answer (the pick) first, then the body it held, in pieces.
	if err := st.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta, Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		st.end(Unsent, "send_failed") // the gateway never had the pick
		return true, err
	}
	return false, st.sendBody(body, true, true)
}

// pickHeaders sets the pick (replacing any client-sent copy) and the picker's headers.
func (st *stream) pickHeaders(eps string, extra map[string]string) *extprocv3.HeaderMutation {
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(DestinationHeader, eps)}}
	for k, v := range extra {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(k, v))
	}
	return hm
}

// sendBody sends a body back as streamed pieces of at most ChunkLimit bytes.
func (st *stream) sendBody(body []byte, request, eos bool) error {
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), ChunkLimit)
		piece := body[:n]
		body = body[n:]
		sb := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: piece, EndOfStream: eos && len(body) == 0}}}}}
		resp := &extprocv3.ProcessingResponse{}
		if request {
			resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: sb}
		} else {
			resp.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: sb}
		}
		if err := st.send(resp); err != nil {
			return err
		}
	}
	return nil
}

func (st *stream) responseHeaders(m *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			st.respStatus, _ = strconv.Atoi(headerValue(hv))
		}
	}
	st.respAt = time.Now()
	st.served = servedEndpoint(m.GetMetadataContext())
	if st.booking != nil && st.served != "" {
		eps := st.booking.Endpoints()
		if len(eps) > 0 && !sameEndpoint(eps[0], st.served) {
			st.s.met.errors.WithLabelValues("served_fallback").Inc()
			st.s.logLimited("served_fallback", "the gateway served a request from a fallback, not the pick; counted in kvroute_router_extproc_errors_total",
				"picked", eps[0], "served", st.served)
		}
		st.booking.Served(st.served)
	}
	common := &extprocv3.CommonResponse{}
	if st.s.o.ConformanceHooks {
		served := st.served
		if served == "" {
			served = "fail: the gateway reported no " + ServedKey
		}
		common.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(TestServedHeader, served)}}
	}
	if st.watch.dropUse && !h.GetEndOfStream() {
		// The usage chunk the picker adds may leave: the length is no longer the engine's.
		if common.HeaderMutation == nil {
			common.HeaderMutation = &extprocv3.HeaderMutation{}
		}
		common.HeaderMutation.RemoveHeaders = append(common.HeaderMutation.RemoveHeaders, "content-length")
	}
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		return true, err
	}
	if h.GetEndOfStream() || st.respMode == filterv3.ProcessingMode_NONE {
		// No body will come to this picker: the answer's end is all it learns.
		st.end(st.headersOnlyPhase(), "")
	}
	return false, nil
}

func (st *stream) headersOnlyPhase() Phase {
	if st.respStatus >= 400 {
		return Refused
	}
	return Complete
}

func (st *stream) responseBody(b *extprocv3.HttpBody) (bool, error) {
	out, firstNow := st.watch.feed(b.GetBody(), b.GetEndOfStream())
	if firstNow && st.booking != nil && !st.ended && st.respStatus < 400 && st.watch.engineErr == "" {
		st.firstAt = time.Now()
		st.booking.FirstToken()
	}
	var err error
	switch st.respMode {
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		common := &extprocv3.CommonResponse{}
		if st.watch.dropUse {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
		}
		err = st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: common}}})
	default:
		err = st.sendBody(out, false, b.GetEndOfStream())
	}
	if err != nil {
		return true, err
	}
	if b.GetEndOfStream() {
		st.end(st.bodyPhase(), "")
		return true, nil
	}
	return false, nil
}

// bodyPhase classifies an answer that reached its end.
func (st *stream) bodyPhase() Phase {
	switch {
	case st.respStatus >= 400:
		return Refused
	case st.watch.engineErr != "":
		return Cut
	case st.watch.stream && !st.watch.done && !st.watch.overflow:
		return Cut // no [DONE]: the engine's stream broke off
	}
	return Complete
}

// recvEnded handles the gateway closing the stream (or breaking it).
func (st *stream) recvEnded(err error) error {
	switch {
	case errors.Is(err, io.EOF), status.Code(err) == codes.Canceled:
		st.reason = "gateway_closed"
		return nil
	}
	st.s.met.errors.WithLabelValues("stream_error").Inc()
	st.s.logLimited("stream_error", "ext_proc stream broke; counted in kvroute_router_extproc_errors_total", "err", err)
	st.reason = "stream_error"
	return nil
}

// finish ends a booking the exchange left open: the stream closed or broke before the answer's
// end (the client went away, the gateway gave up, a timeout).
func (st *stream) finish() {
	if st.booking == nil || st.ended {
		return
	}
	ph := Abandoned
	if st.respStatus > 0 && !st.firstAt.IsZero() {
		ph = Cut
	}
	if st.reason == "" {
		st.reason = "gateway_closed"
	}
	if st.respStatus > 0 && st.respMode == filterv3.ProcessingMode_NONE {
		ph = st.headersOnlyPhase()
	}
	st.end(ph, st.reason)
}

func (st *stream) end(ph Phase, reason string) {
	if st.booking == nil || st.ended {
		return
	}
	st.ended = true
	res := Result{Phase: ph, Status: st.respStatus, Served: st.served, Usage: st.watch.usage,
		EngineError: st.watch.engineErr, Reason: reason, ResponseID: st.watch.responseID}
	if !st.firstAt.IsZero() {
		res.TTFT = st.firstAt.Sub(st.picked)
	}
	if !st.respAt.IsZero() {
		res.HeadersAfter = st.respAt.Sub(st.picked)
	}
	if st.watch.overflow {
		st.s.met.errors.WithLabelValues("answer_unread").Inc()
		st.s.logLimited("answer_unread", "an answer or event over the picker's bound was passed on unread; its usage is unknown, counted in kvroute_router_extproc_errors_total")
	}
	st.s.met.streams.WithLabelValues(ph.String()).Inc()
	st.booking.End(res)
}

// immediate answers the client directly with an OpenAI-shaped error.
func (st *stream) immediate(code int, typ, msg, reason string) error {
	st.s.met.immediate.WithLabelValues(strconv.Itoa(code), reason).Inc()
	st.answered = true
	return st.send(immediateResponse(code, errorJSON(code, typ, msg)))
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(r); err != nil {
		st.s.met.errors.WithLabelValues("send_failed").Inc()
		st.reason = "send_failed"
		return err
	}
	return nil
}
