package extproc

import (
	"encoding/json"
	"net"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/router/proxy"
)

// headerValue reads a header as Envoy sends it: raw_value when set (the default for
// gateways that send raw bytes), value otherwise.
func headerValue(h *corev3.HeaderValue) string {
	if rv := h.GetRawValue(); len(rv) > 0 {
		return string(rv)
	}
	return h.GetValue()
}

// setHeader replaces a header (a client-sent x-gateway-destination-endpoint must not survive
// beside the pick).
func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// splitList splits a comma-separated endpoint list, dropping blanks.
func splitList(v string) []string {
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// subsetHint reads the gateway's subset hint. Gateways write it as a list of strings or as one
// comma-separated string (a header copied into metadata); both are read.
func subsetHint(md *corev3.Metadata) Subset {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	if ns == nil {
		return Subset{}
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return Subset{}
	}
	sub := Subset{Set: true}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		sub.Endpoints = splitList(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			sub.Endpoints = append(sub.Endpoints, splitList(e.GetStringValue())...)
		}
	}
	return sub
}

// servedEndpoint reads the endpoint the gateway reports it used.
func servedEndpoint(md *corev3.Metadata) string {
	ns := md.GetFilterMetadata()[MetadataNamespace]
	if ns == nil {
		return ""
	}
	return strings.TrimSpace(ns.GetFields()[ServedKey].GetStringValue())
}

// sameEndpoint compares two ip:port strings, tolerant of IPv6 spelling.
func sameEndpoint(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return a == b
	}
	ia, ib := net.ParseIP(ha), net.ParseIP(hb)
	if ia != nil && ib != nil {
		return ia.Equal(ib) && pa == pb
	}
	return ha == hb && pa == pb
}

// InSubset reports whether an endpoint (ip:port) is in a subset: an entry names ip:port, or a
// bare address naming every port of it.
func InSubset(sub Subset, endpoint string) bool {
	if !sub.Set {
		return true
	}
	host, _, err := net.SplitHostPort(endpoint)
	for _, e := range sub.Endpoints {
		if sameEndpoint(e, endpoint) {
			return true
		}
		if _, _, perr := net.SplitHostPort(e); perr == nil || err != nil {
			continue // an ip:port that did not match
		}
		bare := strings.Trim(e, "[]")
		if ip := net.ParseIP(bare); bare == host || (ip != nil && ip.Equal(net.ParseIP(host))) {
			return true
		}
	}
	return false
}

// pickMetadata is the pick as dynamic metadata, the same value as the header.
func pickMetadata(eps string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationHeader: structpb.NewStringValue(eps),
		}}),
	}}
}

func immediateResponse(code int, body []byte) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}},
			Body:    body,
			Details: "kvroute_endpoint_picker",
		}}}
}

// errorJSON is an OpenAI-shaped error body.
func errorJSON(code int, typ, msg string) []byte {
	b, _ := json.Marshal(proxy.ErrorBody{Error: proxy.ErrorDetail{Message: msg, Type: typ, Code: code}})
	return b
}

// ErrorJSON is the OpenAI-shaped error body a Picker's refusal carries.
func ErrorJSON(code int, typ, msg string) []byte { return errorJSON(code, typ, msg) }

type metrics struct {
	active      prometheus.Gauge
	streams     *prometheus.CounterVec
	immediate   *prometheus.CounterVec
	errors      *prometheus.CounterVec
	pickSeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "kvroute_router", "extproc"
	m := &metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "active_streams",
			Help: "ext_proc streams open (requests a gateway is asking the picker about or that are in flight)."}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "Picked requests by how they ended (unsent, refused, complete, cut, abandoned)."}, []string{"phase"}),
		immediate: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "immediate_responses_total",
			Help: "Requests the picker answered itself instead of picking, by HTTP status and reason."}, []string{"code", "reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "errors_total",
			Help: "ext_proc exchanges that went wrong or degraded, by reason (body_timeout, body_too_large, stream_timeout, stream_error, send_failed, protocol, served_fallback, answer_unread)."},
			[]string{"reason"}),
		pickSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "pick_seconds",
			Help:    "Time from a request's headers reaching the picker to its pick being sent (body read, keyed, decided).",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}}),
	}
	if reg != nil {
		reg.MustRegister(m.active, m.streams, m.immediate, m.errors, m.pickSeconds)
	}
	return m
}
