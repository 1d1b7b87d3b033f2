package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/capture"
)

// kvbench cache takes what kvrouter's capture writes, as a file and as the capture directory
// (several rotated files): a hot system prompt captured from token ids shows as reuse.
func TestCacheReadsACapture(t *testing.T) {
	dir := t.TempDir()
	rec, err := capture.New(capture.Options{Dir: dir, MaxBytes: 2048, Files: 100})
	if err != nil {
		t.Fatal(err)
	}
	sys := make([]uint32, 4*512)
	for i := range sys {
		sys[i] = uint32(1000 + i)
	}
	start := time.Now()
	for i := 0; i < 60; i++ {
		toks := append(append([]uint32(nil), sys...), make([]uint32, 700)...)
		for j := len(sys); j < len(toks); j++ {
			toks[j] = uint32(50000 + i*1000 + j)
		}
		rec.Observe(capture.Request{Arrival: start.Add(time.Duration(i) * 100 * time.Millisecond), Tokens: toks, OutputTokens: 20})
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := capture.Files(dir)
	if len(files) < 2 {
		t.Fatalf("%d capture files, want rotation", len(files))
	}
	for _, trace := range []string{dir, files[0]} {
		out, stderr, rc := kvbench(t, "cache", "--trace", trace, "--replicas", "2", "--capacity-blocks", "200",
			"--policies", "kv,round-robin", "--json")
		if rc != 0 {
			t.Fatalf("%s: rc %d: %s", trace, rc, stderr)
		}
		var doc cacheOutput
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		for _, r := range doc.Results {
			// 4 of 6 blocks are the shared prompt; each replica misses it once at most.
			if r.HitRateBlocks < 0.4 {
				t.Errorf("%s: %s hit %.3f of blocks, want the shared prompt's reuse", trace, r.Policy, r.HitRateBlocks)
			}
		}
	}
}
