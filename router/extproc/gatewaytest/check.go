package gatewaytest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/router/extproc"
)

// CheckOptions configure Check.
type CheckOptions struct {
	// Model is the model name the requests carry (the engines' served name).
	Model string
	// Conformance expects the conformance suite's hooks (test-epp-endpoint-selection honoured,
	// x-conformance-test-served-endpoint echoed); without it that check is skipped.
	Conformance bool
	// TLS dials the picker over TLS (nil: plaintext).
	TLS *tls.Config
	// Timeout bounds each check (default 60s).
	Timeout time.Duration
}

// Outcome is one check's verdict.
type Outcome struct {
	Name    string
	Pass    bool
	Skipped bool
	Detail  string
}

// checker carries what the checks learn from one another (the endpoints seen).
type checker struct {
	g    *Gateway
	o    CheckOptions
	seen []string
}

type check struct {
	name string
	run  func(c *checker, ctx context.Context) (string, error)
}

var checks = []check{
	{"health", (*checker).health},
	{"pick-full-duplex-stream", (*checker).fullDuplexStream},
	{"pick-buffered", (*checker).buffered},
	{"pick-completions", (*checker).completions},
	{"same-prefix-same-endpoint", (*checker).affinity},
	{"subset-hint", (*checker).subset},
	{"subset-none-eligible-503", (*checker).subsetEmpty},
	{"bad-body-4xx", (*checker).badBody},
	{"cut-mid-response", (*checker).cut},
	{"client-gone", (*checker).clientGone},
	{"conformance-hooks", (*checker).conformance},
}

// errSkip marks a check that does not apply.
type errSkip string

func (e errSkip) Error() string { return string(e) }

// Check runs the endpoint picker checks against a picker's ext_proc address, forwarding each
// request to the endpoint picked. Any picker of the Inference Extension's protocol can be
// checked; the engines behind it must serve Model.
func Check(ctx context.Context, addr string, o CheckOptions) ([]Outcome, error) {
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	var dial []DialOption
	if o.TLS != nil {
		dial = append(dial, WithTLS(o.TLS))
	}
	g, err := Dial(addr, dial...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = g.Close() }()
	c := &checker{g: g, o: o}
	out := make([]Outcome, 0, len(checks))
	for _, ck := range checks {
		cctx, cancel := context.WithTimeout(ctx, o.Timeout)
		detail, err := ck.run(c, cctx)
		cancel()
		oc := Outcome{Name: ck.name, Pass: err == nil, Detail: detail}
		if sk, ok := err.(errSkip); ok {
			oc.Pass, oc.Skipped, oc.Detail = true, true, string(sk)
		} else if err != nil {
			oc.Detail = err.Error()
		}
		out = append(out, oc)
	}
	return out, nil
}

func (c *checker) chat(stream bool, prompt string) []byte {
	b, _ := json.Marshal(map[string]any{"model": c.o.Model, "stream": stream, "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	return b
}

// picked checks what every pick must be and remembers the endpoints.
func (c *checker) picked(res *Result, wantStatus int) error {
	if res.Immediate {
		return fmt.Errorf("the picker answered %d itself: %s", res.Status, clip(res.ClientBody))
	}
	if len(res.Endpoints) == 0 {
		return fmt.Errorf("no %s header on the pick", extproc.DestinationHeader)
	}
	for _, e := range res.Endpoints {
		if !ValidEndpoint(e) {
			return fmt.Errorf("endpoint %q is not ip:port", e)
		}
		if !slices.Contains(c.seen, strings.TrimSpace(e)) {
			c.seen = append(c.seen, strings.TrimSpace(e))
		}
	}
	if res.MetadataPick != strings.Join(res.Endpoints, ",") {
		return fmt.Errorf("dynamic metadata %s/%s = %q differs from the header %q", extproc.MetadataNamespace,
			extproc.DestinationHeader, res.MetadataPick, strings.Join(res.Endpoints, ","))
	}
	if res.MaxPiece > extproc.ChunkLimit {
		return fmt.Errorf("a streamed body piece of %d bytes (over %d)", res.MaxPiece, extproc.ChunkLimit)
	}
	if res.Status != wantStatus {
		return fmt.Errorf("the endpoint %s answered %d (want %d): %s", res.Served, res.Status, wantStatus, clip(res.ClientBody))
	}
	return nil
}

func clip(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

func (c *checker) health(ctx context.Context) (string, error) {
	hc := healthpb.NewHealthClient(c.g.Conn())
	for _, svc := range []string{"liveness", "readiness", extproc.ServiceName} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return "", fmt.Errorf("health %q: %w", svc, err)
		}
		if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return "", fmt.Errorf("health %q is %v", svc, r.GetStatus())
		}
	}
	return "liveness, readiness, " + extproc.ServiceName + ": SERVING", nil
}

func (c *checker) fullDuplexStream(ctx context.Context) (string, error) {
	prompt := strings.Repeat("The gateway streams this body in pieces. ", 2500) // ~100 KB
	body := c.chat(true, prompt)
	res, err := c.g.Do(ctx, Request{Body: body, Chunk: 10_000})
	if err != nil {
		return "", err
	}
	if err := c.picked(res, http.StatusOK); err != nil {
		return "", err
	}
	var up struct {
		Model    string `json:"model"`
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(res.UpstreamBody, &up); err != nil || up.Model != c.o.Model || len(up.Messages) != 1 || up.Messages[0].Content != prompt {
		return "", fmt.Errorf("the body the picker let through is not the request (%d of %d bytes): %v", len(res.UpstreamBody), len(body), err)
	}
	if !bytes.Contains(res.ClientBody, []byte("data: [DONE]")) {
		return "", fmt.Errorf("the client's stream lost its end: %s", clip(res.ClientBody))
	}
	return fmt.Sprintf("%d-byte body in 10 kB chunks, picked %s in %v, largest piece back %d bytes", len(body),
		strings.Join(res.Endpoints, ","), res.PickLatency.Round(time.Microsecond), res.MaxPiece), nil
}

func (c *checker) buffered(ctx context.Context) (string, error) {
	res, err := c.g.Do(ctx, Request{Body: c.chat(false, "a buffered request"), Mode: Buffered})
	if err != nil {
		return "", err
	}
	if err := c.picked(res, http.StatusOK); err != nil {
		return "", err
	}
	if !bytes.Contains(res.ClientBody, []byte(`"choices"`)) {
		return "", fmt.Errorf("the answer has no choices: %s", clip(res.ClientBody))
	}
	return "picked " + strings.Join(res.Endpoints, ","), nil
}

func (c *checker) completions(ctx context.Context) (string, error) {
	b, _ := json.Marshal(map[string]any{"model": c.o.Model, "prompt": "plain completions", "max_tokens": 4})
	res, err := c.g.Do(ctx, Request{Path: "/v1/completions", Body: b})
	if err != nil {
		return "", err
	}
	if err := c.picked(res, http.StatusOK); err != nil {
		return "", err
	}
	return "picked " + strings.Join(res.Endpoints, ","), nil
}

func (c *checker) affinity(ctx context.Context) (string, error) {
	prefix := fmt.Sprintf("Shared system prompt %d. ", time.Now().UnixNano()) + strings.Repeat("Context that repeats across requests. ", 120)
	var first string
	for i := range 3 {
		res, err := c.g.Do(ctx, Request{Body: c.chat(false, prefix+fmt.Sprintf("question %d", i))})
		if err != nil {
			return "", err
		}
		if err := c.picked(res, http.StatusOK); err != nil {
			return "", err
		}
		if i == 0 {
			first = res.Served
			continue
		}
		if res.Served != first {
			return "", fmt.Errorf("request %d sharing a %d-byte prefix went to %s, the first to %s (a KV-aware picker keeps them together)",
				i, len(prefix), res.Served, first)
		}
	}
	return "3 requests sharing a prefix all served by " + first, nil
}

func (c *checker) subset(ctx context.Context) (string, error) {
	if len(c.seen) == 0 {
		return "", errSkip("no endpoint seen yet to build a subset from")
	}
	target := c.seen[len(c.seen)-1]
	for _, asString := range []bool{false, true} {
		res, err := c.g.Do(ctx, Request{Body: c.chat(false, "subset"), HasSubset: true, Subset: []string{target}, SubsetAsString: asString})
		if err != nil {
			return "", err
		}
		if err := c.picked(res, http.StatusOK); err != nil {
			return "", err
		}
		for _, e := range res.Endpoints {
			if strings.TrimSpace(e) != target {
				return "", fmt.Errorf("subset [%s] (as a string: %v) but the pick names %s", target, asString, e)
			}
		}
	}
	return "subset [" + target + "] as a list and as a string: picked only it", nil
}

func (c *checker) subsetEmpty(ctx context.Context) (string, error) {
	for _, sub := range [][]string{{}, {"192.0.2.1:9"}} {
		res, err := c.g.Do(ctx, Request{Body: c.chat(false, "nothing eligible"), HasSubset: true, Subset: sub})
		if err != nil {
			return "", err
		}
		if !res.Immediate || res.Status != http.StatusServiceUnavailable {
			return "", fmt.Errorf("subset %v: want an immediate 503, got status %d (immediate %v, pick %v)", sub, res.Status, res.Immediate, res.Endpoints)
		}
	}
	return "empty subset and a subset of an unknown endpoint: 503", nil
}

func (c *checker) badBody(ctx context.Context) (string, error) {
	res, err := c.g.Do(ctx, Request{Body: []byte(`{"model": "` + c.o.Model + `", "messages": [`)})
	if err != nil {
		return "", err
	}
	if !res.Immediate || res.Status < 400 || res.Status >= 500 {
		return "", fmt.Errorf("truncated JSON: want an immediate 4xx, got status %d (immediate %v)", res.Status, res.Immediate)
	}
	var eb struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(res.ClientBody, &eb) != nil || eb.Error == nil || eb.Error.Message == "" {
		return "", fmt.Errorf("the %d answer is not an OpenAI-shaped error: %s", res.Status, clip(res.ClientBody))
	}
	return fmt.Sprintf("%d: %s", res.Status, eb.Error.Message), nil
}

// after checks the picker still picks once an exchange ended badly.
func (c *checker) after(ctx context.Context, what string) (string, error) {
	res, err := c.g.Do(ctx, Request{Body: c.chat(false, "after "+what)})
	if err != nil {
		return "", fmt.Errorf("the next request after %s: %w", what, err)
	}
	if err := c.picked(res, http.StatusOK); err != nil {
		return "", fmt.Errorf("the next request after %s: %w", what, err)
	}
	return "the next request was picked and served", nil
}

func (c *checker) cut(ctx context.Context) (string, error) {
	if _, err := c.g.Do(ctx, Request{Body: c.chat(true, "cut me off"), CutAfter: 1}); err != nil {
		return "", err
	}
	return c.after(ctx, "a response cut off")
}

func (c *checker) clientGone(ctx context.Context) (string, error) {
	if _, err := c.g.Do(ctx, Request{Body: c.chat(true, "I will leave"), LeaveAfterPick: true}); err != nil {
		return "", err
	}
	return c.after(ctx, "a client that left after the pick")
}

func (c *checker) conformance(ctx context.Context) (string, error) {
	if !c.o.Conformance {
		return "", errSkip("conformance hooks not asked for (--conformance)")
	}
	if len(c.seen) == 0 {
		return "", errSkip("no endpoint seen yet")
	}
	target := c.seen[0]
	res, err := c.g.Do(ctx, Request{Body: c.chat(false, "conformance"), Header: http.Header{"Test-Epp-Endpoint-Selection": {target}}})
	if err != nil {
		return "", err
	}
	if err := c.picked(res, http.StatusOK); err != nil {
		return "", err
	}
	if strings.TrimSpace(res.Endpoints[0]) != target {
		return "", fmt.Errorf("%s: %s but the pick is %v", extproc.TestSelectionHeader, target, res.Endpoints)
	}
	if got := res.ResponseHdrs.Get(extproc.TestServedHeader); got != res.Served {
		return "", fmt.Errorf("%s echoed %q, served by %s", extproc.TestServedHeader, got, res.Served)
	}
	return extproc.TestSelectionHeader + " honoured, " + extproc.TestServedHeader + " echoed", nil
}
