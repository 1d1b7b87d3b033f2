// Package gatewaytest plays the gateway in front of an endpoint picker: it drives a picker's
// ext_proc service as Envoy does (request headers, the body in chunks, the pick read back from
// the header and the dynamic metadata, the response headers with the served endpoint, the
// response body) and forwards each request itself, over HTTP, to the endpoint picked, so the
// picker routes real traffic. Check runs a black-box conformance suite of the Inference
// Extension's Endpoint Picker Protocol against any picker (kvroutectl epp-check).
package gatewaytest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/router/extproc"
)

// Gateway is a client of one picker.
type Gateway struct {
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	// HTTP forwards requests to the endpoints picked.
	HTTP *http.Client
}

// DialOption changes how Dial connects.
type DialOption func(*dialOptions)

type dialOptions struct{ tls *tls.Config }

// WithTLS dials the picker over TLS with cfg; gateways dial a picker with verification off
// (InsecureSkipVerify), since the Inference Extension's picker serves a self-signed
// certificate by default.
func WithTLS(cfg *tls.Config) DialOption { return func(o *dialOptions) { o.tls = cfg } }

// Dial connects to a picker's ext_proc address (host:port; plaintext gRPC unless WithTLS).
func Dial(addr string, opts ...DialOption) (*Gateway, error) {
	var o dialOptions
	for _, f := range opts {
		f(&o)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	return &Gateway{conn: conn, client: extprocv3.NewExternalProcessorClient(conn),
		HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}, nil
}

// Conn is the gRPC connection (for the health services).
func (g *Gateway) Conn() *grpc.ClientConn { return g.conn }

// Close closes the connection.
func (g *Gateway) Close() error { return g.conn.Close() }

// Mode is how the gateway sends bodies (the ext_proc filter's processing mode).
type Mode int

const (
	// FullDuplex streams bodies both ways without waiting (FULL_DUPLEX_STREAMED), the mode the
	// Inference Extension's gateways use.
	FullDuplex Mode = iota
	// Buffered sends each body whole and waits for each answer (BUFFERED).
	Buffered
)

// Request is one request the gateway sends.
type Request struct {
	Path   string // default /v1/chat/completions
	Header http.Header
	Body   []byte
	// Chunk splits the request body into messages of this many bytes (0: 16 KiB).
	Chunk int
	Mode  Mode
	// Subset, when set, is sent as the subset hint (SubsetAsString: as one comma-separated
	// string, the way a header copied into metadata arrives).
	Subset         []string
	HasSubset      bool
	SubsetAsString bool
	// CutAfter, when > 0, breaks the response off after that many response body bytes: the
	// gateway closes the ext_proc stream without the body's end, as when an upstream
	// connection drops.
	CutAfter int
	// LeaveAfterPick cancels the exchange right after the pick, before any response: a client
	// that went away.
	LeaveAfterPick bool
	// StallBody sends the first body piece and no more: a client that stalls mid-body.
	StallBody bool
	// NoForward skips the HTTP request: the response is made up (Status 200, Fake as body).
	NoForward bool
	Fake      []byte
	// OnClientBody, when set, is called with each piece of the response body the picker lets
	// through, as the gateway would pass it on to its client: in full duplex while the engine
	// still streams (the picker's answers are read as they come, beside the upstream read), in
	// buffered mode once with the whole body. A caller times the first token there as its client
	// sees it (kvbench). It runs on the reading goroutine: it must not block for long.
	OnClientBody func(piece []byte)
}

// Result is what one exchange produced.
type Result struct {
	// Immediate is set when the picker answered the request itself (no pick).
	Immediate     bool
	Status        int
	Endpoints     []string // the pick, best first
	MetadataPick  string   // the pick as dynamic metadata envoy.lb
	Served        string   // the endpoint that answered
	UpstreamBody  []byte   // the request body the picker let through
	SetHeaders    http.Header
	ResponseHdrs  http.Header // the response header mutations the picker asked for
	ClientBody    []byte      // the response body after the picker's changes
	MaxPiece      int         // the largest body piece the picker sent back
	PickLatency   time.Duration
	ForwardErrors []string
}

// Do runs one request through the picker and, unless told otherwise, to the endpoint.
func (g *Gateway) Do(ctx context.Context, r Request) (*Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := g.client.Process(ctx)
	if err != nil {
		return nil, err
	}
	rx := make(chan *extprocv3.ProcessingResponse, 64)
	rxErr := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				rxErr <- err
				close(rx)
				return
			}
			rx <- m
		}
	}()
	res := &Result{SetHeaders: http.Header{}, ResponseHdrs: http.Header{}}
	t0 := time.Now()
	// io.EOF from a send is the picker having ended the stream (gRPC reports the server's
	// status on the receive side): an answer it gave before the body's end, say a 413 for a body
	// over its limit, is read below like any other.
	if err := g.sendRequest(st, r); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if err := readPick(rx, rxErr, r, res); err != nil || res.Immediate {
		_ = st.CloseSend()
		return res, err
	}
	res.PickLatency = time.Since(t0)
	if r.LeaveAfterPick {
		cancel()
		return res, nil
	}
	resp, served, err := g.forward(ctx, r, res)
	if err != nil {
		// The gateway could not reach any endpoint: it answers 503 itself; the picker hears
		// the stream close.
		_ = st.CloseSend()
		res.Status = http.StatusServiceUnavailable
		return res, nil
	}
	defer resp.Body.Close()
	res.Status, res.Served = resp.StatusCode, served
	if err := g.relayResponse(st, rx, rxErr, r, resp, res, cancel); err != nil {
		return res, err
	}
	return res, nil
}

// sendRequest sends the headers and the body in chunks, as the gateway reads them.
func (g *Gateway) sendRequest(st extprocv3.ExternalProcessor_ProcessClient, r Request) error {
	path := r.Path
	if path == "" {
		path = "/v1/chat/completions"
	}
	hm := &corev3.HeaderMap{}
	add := func(k, v string) {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	add(":method", http.MethodPost)
	add(":path", path)
	add(":authority", "gateway.test")
	add("content-type", "application/json")
	for k, vs := range r.Header {
		for _, v := range vs {
			add(strings.ToLower(k), v)
		}
	}
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if r.Mode == Buffered {
		mode = filterv3.ProcessingMode_BUFFERED
	}
	first := &extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: hm, EndOfStream: len(r.Body) == 0}},
	}
	if r.HasSubset {
		first.MetadataContext = subsetMetadata(r.Subset, r.SubsetAsString)
	}
	if err := st.Send(first); err != nil {
		return err
	}
	if len(r.Body) == 0 {
		return nil
	}
	if r.Mode == Buffered {
		// The buffered gateway waits for the headers' answer before the body; the caller's
		// reader sees it first (readPick). Sending now is fine: gRPC queues it.
		return st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: r.Body, EndOfStream: true}}})
	}
	chunk := r.Chunk
	if chunk <= 0 {
		chunk = 16 << 10
	}
	for b := r.Body; len(b) > 0; {
		n := min(chunk, len(b))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: b[:n], EndOfStream: n == len(b) && !r.StallBody}}}); err != nil {
			return err
		}
		if r.StallBody {
			return nil
		}
		b = b[n:]
	}
	return nil
}

func subsetMetadata(eps []string, asString bool) *corev3.Metadata {
	var v *structpb.Value
	if asString {
		v = structpb.NewStringValue(strings.Join(eps, ","))
	} else {
		vals := make([]*structpb.Value, len(eps))
		for i, e := range eps {
			vals[i] = structpb.NewStringValue(e)
		}
		v = structpb.NewListValue(&structpb.ListValue{Values: vals})
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		extproc.SubsetNamespace: {Fields: map[string]*structpb.Value{extproc.SubsetKey: v}},
	}}
}

// next reads the picker's next message.
func next(rx <-chan *extprocv3.ProcessingResponse, rxErr <-chan error) (*extprocv3.ProcessingResponse, error) {
	select {
	case m, ok := <-rx:
		if ok {
			return m, nil
		}
		return nil, <-rxErr
	case <-time.After(30 * time.Second):
		return nil, errors.New("the picker sent nothing for 30s")
	}
}

// readPick reads the picker's answers to the request: the pick (on the headers' answer, or on
// the body's in buffered mode) and the body it lets through, or an immediate response.
func readPick(rx <-chan *extprocv3.ProcessingResponse, rxErr <-chan error, r Request, res *Result) error {
	bodyDone := len(r.Body) == 0
	picked := false
	for !picked || !bodyDone {
		m, err := next(rx, rxErr)
		if err != nil {
			return fmt.Errorf("reading the pick: %w", err)
		}
		if ir := m.GetImmediateResponse(); ir != nil {
			res.Immediate, res.Status, res.ClientBody = true, int(ir.GetStatus().GetCode()), ir.GetBody()
			return nil
		}
		var common *extprocv3.CommonResponse
		switch v := m.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			common = v.RequestHeaders.GetResponse()
		case *extprocv3.ProcessingResponse_RequestBody:
			common = v.RequestBody.GetResponse()
			if r.Mode == Buffered {
				bodyDone = true
				res.UpstreamBody = r.Body
			}
		default:
			return fmt.Errorf("unexpected %T before the pick", m.Response)
		}
		for _, h := range common.GetHeaderMutation().GetSetHeaders() {
			k, v := h.GetHeader().GetKey(), headerValue(h.GetHeader())
			res.SetHeaders.Set(k, v)
			if strings.EqualFold(k, extproc.DestinationHeader) {
				picked = true
				res.Endpoints = strings.Split(v, ",")
			}
		}
		if md := m.GetDynamicMetadata(); md != nil {
			res.MetadataPick = md.GetFields()[extproc.MetadataNamespace].GetStructValue().GetFields()[extproc.DestinationHeader].GetStringValue()
		}
		switch bm := common.GetBodyMutation().GetMutation().(type) {
		case *extprocv3.BodyMutation_StreamedResponse:
			res.UpstreamBody = append(res.UpstreamBody, bm.StreamedResponse.GetBody()...)
			res.MaxPiece = max(res.MaxPiece, len(bm.StreamedResponse.GetBody()))
			if bm.StreamedResponse.GetEndOfStream() {
				bodyDone = true
			}
		case *extprocv3.BodyMutation_Body:
			res.UpstreamBody = bm.Body
		}
	}
	return nil
}

func headerValue(h *corev3.HeaderValue) string {
	if rv := h.GetRawValue(); len(rv) > 0 {
		return string(rv)
	}
	return h.GetValue()
}

// forward sends the request to the first endpoint of the pick that answers, as a gateway's
// retry policy goes down the list.
func (g *Gateway) forward(ctx context.Context, r Request, res *Result) (*http.Response, string, error) {
	path := r.Path
	if path == "" {
		path = "/v1/chat/completions"
	}
	if r.NoForward {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(bytes.NewReader(r.Fake))}, res.Endpoints[0], nil
	}
	var lastErr error
	for _, ep := range res.Endpoints {
		ep = strings.TrimSpace(ep)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep+path, bytes.NewReader(res.UpstreamBody))
		if err != nil {
			return nil, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		for k, vs := range r.Header {
			req.Header[k] = vs
		}
		for k := range res.SetHeaders {
			if !strings.EqualFold(k, extproc.DestinationHeader) {
				req.Header.Set(k, res.SetHeaders.Get(k))
			}
		}
		resp, err := g.HTTP.Do(req)
		if err == nil {
			return resp, ep, nil
		}
		lastErr = err
		res.ForwardErrors = append(res.ForwardErrors, ep+": "+err.Error())
	}
	return nil, "", lastErr
}

// relayResponse sends the response headers (with the served endpoint) and the body to the
// picker as it arrives, and collects what the picker lets through.
func (g *Gateway) relayResponse(st extprocv3.ExternalProcessor_ProcessClient, rx <-chan *extprocv3.ProcessingResponse, rxErr <-chan error,
	r Request, resp *http.Response, res *Result, cancel context.CancelFunc) error {
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(resp.StatusCode))}}}
	for k, vs := range resp.Header {
		for _, v := range vs {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	served := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		extproc.MetadataNamespace: {Fields: map[string]*structpb.Value{extproc.ServedKey: structpb.NewStringValue(res.Served)}},
	}}
	if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: served, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm}}}); err != nil {
		return err
	}
	m, err := next(rx, rxErr)
	if err != nil {
		return fmt.Errorf("reading the response headers' answer: %w", err)
	}
	rh := m.GetResponseHeaders()
	if rh == nil {
		return fmt.Errorf("expected the response headers' answer, got %T", m.Response)
	}
	for _, h := range rh.GetResponse().GetHeaderMutation().GetSetHeaders() {
		res.ResponseHdrs.Set(h.GetHeader().GetKey(), headerValue(h.GetHeader()))
	}
	if r.Mode == Buffered {
		whole, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("reading the engine's answer: %w", err)
		}
		if err := sendBody(st, whole, true); err != nil {
			return err
		}
		res.ClientBody = whole
		err = collectBody(rx, rxErr, r, res)
		if err == nil && r.OnClientBody != nil {
			r.OnClientBody(res.ClientBody)
		}
		return err
	}
	// Full duplex: the picker's answers are read beside the upstream read, as Envoy passes each
	// piece on when the picker sends it back, not after the engine's last byte. Every path
	// below waits for the reader before it returns, so res is the caller's alone after.
	collected := make(chan error, 1)
	go func() { collected <- collectBody(rx, rxErr, r, res) }()
	fail := func(err error) error {
		cancel()
		_ = <-collected // the reader ends on the cancel; the first error is the one to report
		return err
	}
	sent := 0
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if rerr != nil && !eos {
			return fail(fmt.Errorf("reading the engine's answer: %w", rerr))
		}
		piece := buf[:n]
		if r.CutAfter > 0 && sent+n >= r.CutAfter {
			piece = piece[:r.CutAfter-sent]
			if err := sendBody(st, piece, false); err != nil {
				return fail(err)
			}
			// The upstream broke: the gateway ends the exchange without the body's end, and
			// waits for the picker to close its side (the reader ends on the stream's end).
			if err := st.CloseSend(); err != nil {
				return fail(err)
			}
			_ = <-collected // ends with the stream's end, an error by design here
			return nil
		}
		if n > 0 || eos {
			if err := sendBody(st, piece, eos); err != nil {
				return fail(err)
			}
			sent += n
		}
		if eos {
			break
		}
	}
	return <-collected
}

func sendBody(st extprocv3.ExternalProcessor_ProcessClient, b []byte, eos bool) error {
	return st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), b...), EndOfStream: eos}}})
}

// collectBody reads the picker's answers to the response body up to its end; in full duplex
// each piece goes to r.OnClientBody as it comes.
func collectBody(rx <-chan *extprocv3.ProcessingResponse, rxErr <-chan error, r Request, res *Result) error {
	mode := r.Mode
	for {
		m, err := next(rx, rxErr)
		if err != nil {
			return fmt.Errorf("reading the response body's answers: %w", err)
		}
		rb := m.GetResponseBody()
		if rb == nil {
			return fmt.Errorf("expected a response body answer, got %T", m.Response)
		}
		switch bm := rb.GetResponse().GetBodyMutation().GetMutation().(type) {
		case *extprocv3.BodyMutation_StreamedResponse:
			piece := bm.StreamedResponse.GetBody()
			res.ClientBody = append(res.ClientBody, piece...)
			res.MaxPiece = max(res.MaxPiece, len(piece))
			if r.OnClientBody != nil && len(piece) > 0 {
				r.OnClientBody(piece)
			}
			if bm.StreamedResponse.GetEndOfStream() {
				return nil
			}
		case *extprocv3.BodyMutation_Body:
			res.ClientBody = bm.Body
			return nil
		default:
			if mode == Buffered {
				return nil // unchanged: the engine's body as is
			}
			return errors.New("a full-duplex picker must send each response body piece back")
		}
	}
}

// ValidEndpoint reports whether s is ip:port.
func ValidEndpoint(s string) bool {
	host, port, err := net.SplitHostPort(strings.TrimSpace(s))
	if err != nil || net.ParseIP(host) == nil {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p > 0 && p < 65536
}
