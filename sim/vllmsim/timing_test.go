package vllmsim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

func timingConfig() Config {
	cfg := fastConfig()
	cfg.PrefillTokensPerS = 20000 // 8,000 uncached tokens: 400 ms
	cfg.DecodeMsPerToken = 1
	return cfg
}

// ttft streams a completion and returns the time to its first content chunk.
func ttft(t *testing.T, s *Sim, prompt []uint32) time.Duration {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2, "stream": true})
	start := time.Now()
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			d := time.Since(start)
			for sc.Scan() { // drain so the request completes normally
			}
			return d
		}
	}
	t.Fatalf("no chunk (status %d)", resp.StatusCode)
	return 0
}

// Ordering only, never absolute times: more uncached tokens cost more, cached ones nothing.
func TestTTFTRisesWithUncachedTokens(t *testing.T) {
	s := startSim(t, timingConfig())
	long := seqTokens(0, 8000)
	tLong := ttft(t, s, long)
	tShort := ttft(t, s, seqTokens(20000, 200))
	tCached := ttft(t, s, long) // only the last block is recomputed
	if !(tLong > tShort) || !(tLong > tCached) {
		t.Errorf("TTFT uncached 8000 = %v, uncached 200 = %v, cached 8000 = %v; want the first the largest", tLong, tShort, tCached)
	}
}

func TestTTFTRisesWithLoad(t *testing.T) {
	s := startSim(t, timingConfig())
	probe := seqTokens(50000, 1000)
	alone := ttft(t, s, probe)
	if r := post(t, s, "/reset_prefix_cache", ""); r.status != http.StatusOK {
		t.Fatalf("reset: %d", r.status)
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ttft(t, s, seqTokens(60000+10000*i, 8000))
		}()
	}
	testkit.WaitFor(t, 5*time.Second, "the load to be queued", func() bool {
		r := s.CacheState().Ranks[0]
		return r.Running+r.Waiting == 3
	})
	loaded := ttft(t, s, probe)
	wg.Wait()
	if !(loaded > alone) {
		t.Errorf("TTFT of the same 1000-token prompt alone %v, behind 24,000 queued prefill tokens %v; want it higher under load", alone, loaded)
	}
}
