package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router/capture"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// Offline: bodies of a chat workload that stamps the time at the start of its system prompt,
// and the trace kvrouter captured of them (here written by the capture package from the
// simulator's tokens): the audit names a <timestamp>, shows no text unless asked, and the trace
// shows every prompt starting with a new block.
func TestAuditOffline(t *testing.T) {
	dir := t.TempDir()
	bodies := filepath.Join(dir, "bodies.jsonl")
	rec, err := capture.New(capture.Options{Dir: filepath.Join(dir, "capture")})
	if err != nil {
		t.Fatal(err)
	}
	var bb bytes.Buffer
	system := strings.Repeat("You are the assistant of a bookshop; answer briefly and never invent delivery dates. ", 16)
	t0 := time.Date(2026, 12, 3, 17, 15, 2, 0, time.UTC)
	for i := 0; i < 30; i++ {
		sys := "Current time: " + t0.Add(time.Duration(i*61)*time.Second).Format(time.RFC3339) + ". " + system
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
			{"role": "system", "content": sys}, {"role": "user", "content": fmt.Sprintf("Where is order %d?", i)}}})
		bb.Write(append(b, '\n'))
		rec.Observe(capture.Request{Arrival: t0, Tokens: vllmsim.Tokenize(sys + fmt.Sprintf("Where is order %d?", i))})
	}
	bb.WriteString("not json\n")
	_ = rec.Close()
	if err := os.WriteFile(bodies, bb.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if rc := run([]string{"audit", "--bodies", bodies, "--trace", filepath.Join(dir, "capture")}, nil, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	s := out.String()
	for _, want := range []string{"trace: 30 requests; 100% start with a 512-token block no earlier request had",
		"bodies: 31 read (30 text, 0 token ids, 1 unreadable)", "pattern 1: <timestamp> at character", "fix: move the varying field"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "2026-12-03") {
		t.Errorf("text shown without --show-text:\n%s", s)
	}
	out.Reset()
	if rc := run([]string{"audit", "--bodies", bodies, "--show-text", "--output", "json"}, nil, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s", rc, errb.String())
	}
	var doc auditOutput
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Patterns) != 1 || len(doc.Patterns[0].Examples) < 3 || !strings.HasPrefix(doc.Patterns[0].Examples[0], "2026-12-03T17:") {
		t.Fatalf("%+v", doc.Patterns)
	}
	if rc := run([]string{"audit"}, nil, &out, &errb); rc != 2 {
		t.Fatalf("no input: rc %d", rc)
	}
}
