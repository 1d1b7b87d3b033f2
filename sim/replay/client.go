package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Outcome is what one replayed request measured.
type Outcome struct {
	Index        int           `json:"index"`
	SentAt       time.Duration `json:"sent_at_ns"` // offset from the start of the run
	TTFT         float64       `json:"ttft_s"`     // first streamed token, seconds
	E2E          float64       `json:"e2e_s"`
	PromptTokens int           `json:"prompt_tokens"`
	CachedTokens int           `json:"cached_tokens"`
	OutputTokens int           `json:"output_tokens"`
	Engine       string        `json:"engine"` // x-kvroute-engine, without the rank
	// Held is how long the request waited past its arrival for a slot under
	// Options.Concurrency, in seconds (0: sent when it arrived). TTFT and E2E start when it is
	// sent, so they leave it out; a held request means the replay ran closed-loop: later
	// arrivals waited on earlier completions, and each policy's traffic arrived differently.
	Held float64 `json:"held_s,omitempty"`
	Err  string  `json:"error,omitempty"`
}

type completionBody struct {
	Model         string         `json:"model"`
	Prompt        []uint32       `json:"prompt"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options"`
	CacheSalt     string         `json:"cache_salt,omitempty"`
}

type streamChunk struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// completionJSON is the request body every replayed request sends, through any front end.
func completionJSON(model string, r *Request, prompt []uint32, maxTokens int) []byte {
	if r.Model != "" {
		model = r.Model
	}
	body, _ := json.Marshal(completionBody{Model: model, Prompt: prompt, MaxTokens: maxTokens, Stream: true,
		StreamOptions: map[string]any{"include_usage": true}, CacheSalt: r.CacheSalt})
	return body
}

// complete sends one streaming completion with a token-id prompt and measures it. An HTTP or
// stream error is recorded in Outcome.Err, never returned: a failed request is a result.
func complete(ctx context.Context, c *http.Client, url, model string, r *Request, prompt []uint32, maxTokens int) Outcome {
	body := completionJSON(model, r, prompt, maxTokens)
	start := time.Now()
	var o Outcome
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		o.Err = err.Error()
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		o.Err = err.Error()
		return o
	}
	defer resp.Body.Close()
	o.Engine, _, _ = strings.Cut(resp.Header.Get("x-kvroute-engine"), "/")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		return o
	}
	readStream(resp.Body, start, &o)
	return o
}

// readStream reads a completion's server-sent events as the client receives them and fills
// the outcome's times, token counts or error, from start (when the request left the client).
func readStream(body io.Reader, start time.Time, o *Outcome) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var ch streamChunk
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			o.Err = "bad stream chunk: " + err.Error()
			return
		}
		if ch.Error != nil {
			o.Err = "stream error: " + ch.Error.Message
			return
		}
		if o.TTFT == 0 && len(ch.Choices) > 0 && ch.Choices[0].Text != "" {
			o.TTFT = time.Since(start).Seconds()
		}
		if u := ch.Usage; u != nil {
			o.PromptTokens, o.OutputTokens = u.PromptTokens, u.CompletionTokens
			if u.PromptTokensDetails != nil {
				o.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		o.Err = "stream: " + err.Error()
		return
	}
	if !done {
		o.Err = "stream ended without [DONE]"
		return
	}
	if o.TTFT == 0 {
		o.TTFT = time.Since(start).Seconds() // no text streamed (max_tokens 0 is not sent); keep a value
	}
	o.E2E = time.Since(start).Seconds()
}
