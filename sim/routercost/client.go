package routercost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
)

// client sends streamed completions with text prompts no earlier request sent.
type client struct {
	http      *http.Client
	model     string
	maxTokens int
	tag       string
	seq       atomic.Uint64
}

func newClient(conns int, model string, maxTokens int, tag string) *client {
	tr := &http.Transport{MaxIdleConns: conns * 2, MaxIdleConnsPerHost: conns * 2, IdleConnTimeout: time.Minute,
		DisableCompression: true}
	return &client{http: &http.Client{Transport: tr, Timeout: 2 * time.Minute}, model: model, maxTokens: maxTokens, tag: tag}
}

// prompt is text of exactly size tokens in vllm-sim's tokenizer (two bytes a token, no special
// markers), starting with a label unique to the request so no cache holds any of its blocks.
func (c *client) prompt(size int) string {
	n := c.seq.Add(1)
	b := make([]byte, 0, 2*size)
	b = fmt.Appendf(b, "%s-%d:", c.tag, n)
	// A cheap generator seeded by the request: varied letters, the same for a given request.
	x := n*0x9E3779B97F4A7C15 + 1
	for len(b) < 2*size {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b = append(b, 'a'+byte(x%26))
	}
	return string(b[:2*size])
}

type result struct {
	ttft time.Duration
	pick time.Duration // through a picker: headers sent to pick received
	err  error
}

type completionRequest struct {
	Model         string         `json:"model"`
	Prompt        string         `json:"prompt"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options"`
}

// complete sends one streamed completion of size prompt tokens to base and reads it to the end;
// the first-token time is the first data event. A stream whose usage does not count size
// prompt tokens is an error: the prompt was not what the measurement meant to send.
func (c *client) complete(ctx context.Context, base string, size int) result {
	body, err := json.Marshal(completionRequest{Model: c.model, Prompt: c.prompt(size), MaxTokens: c.maxTokens,
		Stream: true, StreamOptions: map[string]any{"include_usage": true}})
	if err != nil {
		return result{err: err}
	}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return result{err: fmt.Errorf("%s: status %d: %s", base, resp.StatusCode, bytes.TrimSpace(msg))}
	}
	var res result
	scanStream(resp.Body, base, size, start, &res)
	return res
}

// scanStream reads a completion's events: the first one's time (unless res already has it),
// an in-stream error, and the usage, which must count size prompt tokens.
func scanStream(body io.Reader, base string, size int, start time.Time, res *result) {
	prompt := -1
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok || bytes.Equal(data, []byte("[DONE]")) {
			continue
		}
		if res.ttft == 0 {
			res.ttft = time.Since(start)
		}
		if bytes.Contains(data, []byte(`"usage"`)) {
			var u struct {
				Usage *struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if json.Unmarshal(data, &u) == nil && u.Usage != nil {
				prompt = u.Usage.PromptTokens
			}
		}
		if bytes.Contains(data, []byte(`"error"`)) {
			res.err = fmt.Errorf("%s: in-stream error: %s", base, data)
			return
		}
	}
	if err := sc.Err(); err != nil {
		res.err = fmt.Errorf("%s: reading the stream: %w", base, err)
		return
	}
	if prompt != size {
		res.err = fmt.Errorf("%s: usage counted %d prompt tokens, sent %d", base, prompt, size)
	}
}

// viaGateway sends the same request as complete through an endpoint picker, kvbench playing
// the gateway (router/extproc/gatewaytest, the client kvroutectl epp-check uses): the first
// token's time is when the gateway could pass the first event on to its client (the picker's
// echo of that body piece), and pick is the ext_proc round trip from the request headers sent
// to the pick received (the body's pieces included: the picker reads the body to key it).
func (c *client) viaGateway(ctx context.Context, gw *gatewaytest.Gateway, size int) result {
	body, err := json.Marshal(completionRequest{Model: c.model, Prompt: c.prompt(size), MaxTokens: c.maxTokens,
		Stream: true, StreamOptions: map[string]any{"include_usage": true}})
	if err != nil {
		return result{err: err}
	}
	var res result
	start := time.Now()
	gres, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: body, Mode: gatewaytest.FullDuplex,
		OnClientBody: func(piece []byte) {
			if res.ttft == 0 && bytes.Contains(piece, []byte("data: ")) {
				res.ttft = time.Since(start)
			}
		}})
	switch {
	case err != nil:
		return result{err: fmt.Errorf("gateway: %w", err)}
	case gres.Immediate || gres.Status != http.StatusOK:
		return result{err: fmt.Errorf("gateway: status %d (picker answered itself: %v): %s", gres.Status, gres.Immediate, bytes.TrimSpace(gres.ClientBody))}
	}
	res.pick = gres.PickLatency
	scanStream(bytes.NewReader(gres.ClientBody), "gateway to "+gres.Served, size, start, &res)
	return res
}

// closedLoop sends requests through streams workers, each sending its next request when the
// last one ends, and returns the completed requests per second, their first-token times (ms)
// and how many failed.
func closedLoop(ctx context.Context, send front, size, streams, requests int) (float64, []float64, int) {
	var (
		next   atomic.Int64
		mu     sync.Mutex
		ttft   []float64
		failed int
		wg     sync.WaitGroup
	)
	start := time.Now()
	for range streams {
		wg.Go(func() {
			for next.Add(1) <= int64(requests) && ctx.Err() == nil {
				res := send(ctx, size)
				mu.Lock()
				if res.err != nil {
					failed++
				} else {
					ttft = append(ttft, ms(res.ttft))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	wall := time.Since(start).Seconds()
	return float64(len(ttft)) / wall, ttft, failed
}

// front sends one request of size prompt tokens one way (direct, through the proxy, through
// the picker) and measures it.
type front func(ctx context.Context, size int) result
