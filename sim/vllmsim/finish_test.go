package vllmsim

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
)

// The last token's chunk carries finish_reason, as vLLM's does (the scheduler reports the token
// and the stop together): never an extra empty chunk, however the HTTP side's wake-ups fall.
// Many concurrent streams with fast decode make a wake-up between the two likely.
func TestLastTokenCarriesFinishReason(t *testing.T) {
	s := startSim(t, fastConfig())
	const streams, maxTokens = 40, 4
	var wg sync.WaitGroup
	errs := make(chan string, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"prompt":"hello %d"}`, maxTokens, i)
			r := post(t, s, "/v1/completions", body)
			var chunks []struct {
				Choices []struct {
					Text         string  `json:"text"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			for _, ev := range sseEvents(t, r.body) {
				if ev == "[DONE]" {
					continue
				}
				var c struct {
					Choices []struct {
						Text         string  `json:"text"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					errs <- err.Error()
					return
				}
				if len(c.Choices) > 0 {
					chunks = append(chunks, c)
				}
			}
			if len(chunks) != maxTokens {
				errs <- fmt.Sprintf("stream %d: %d chunks, want %d", i, len(chunks), maxTokens)
				return
			}
			for k, c := range chunks {
				last := k == maxTokens-1
				if c.Choices[0].Text == "" || (c.Choices[0].FinishReason != nil) != last {
					errs <- fmt.Sprintf("stream %d chunk %d: text %q finish %v", i, k, c.Choices[0].Text, c.Choices[0].FinishReason)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// The hand-off itself: a reader polling a request while the rank samples its last token never
// sees that token without the end (the state that made the HTTP side stream an extra empty
// chunk with the finish_reason).
func TestLastTokenAndEndHandedOverTogether(t *testing.T) {
	rk := newTestRank(t, func(*Config) {})
	const n = 2000
	seen := 0
	for i := range n {
		r := testRequest(t, rk, fmt.Sprint(i), seqTokens(10*i, 8), 1)
		rk.submit(r)
		stop := make(chan struct{})
		done := make(chan bool)
		go func() {
			torn := false
			for {
				toks, _, end, _ := r.take(0)
				if len(toks) == 1 && !end {
					torn = true
				}
				select {
				case <-stop:
					done <- torn
					return
				default:
				}
			}
		}()
		for r.state != stateDone {
			stepOnce(rk)
		}
		close(stop)
		if <-done {
			seen++
		}
	}
	if seen > 0 {
		t.Fatalf("%d of %d requests showed their last token before their end", seen, n)
	}
}
