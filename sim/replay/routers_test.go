package replay

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The listening line as kvrouter writes it (cmd/kvrouter: slog, text by default or json), read
// back in both formats; other lines are not taken for it.
func TestParseListening(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		var h slog.Handler = slog.NewTextHandler(&b, nil)
		if format == "json" {
			h = slog.NewJSONHandler(&b, nil)
		}
		lg := slog.New(h)
		lg.Info("kvrouter listening", "api", "127.0.0.1:40001", "admin", "[::1]:40002", "policy", "kv", "engine_api_key", false)
		lg.Info("kvrouter listening", "api", "127.0.0.1:1", "admin", "127.0.0.1:2", "policy", "kv", "engine_api_key", false, "peer_cluster", "127.0.0.1:3")
		lg.Info("something else", "api", "127.0.0.1:9")
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		l, ok := parseListening(lines[0])
		if !ok || l != (listening{API: "127.0.0.1:40001", Admin: "[::1]:40002"}) {
			t.Errorf("%s: %+v %v from %q", format, l, ok, lines[0])
		}
		l, ok = parseListening(lines[1])
		if !ok || l != (listening{API: "127.0.0.1:1", Admin: "127.0.0.1:2", PeerCluster: "127.0.0.1:3"}) {
			t.Errorf("%s: %+v %v from %q", format, l, ok, lines[1])
		}
		if l, ok := parseListening(lines[2]); ok {
			t.Errorf("%s: %+v from %q", format, l, lines[2])
		}
	}
}

func TestRouterFlagChecks(t *testing.T) {
	for _, tc := range []struct {
		args []string
		hide bool
	}{
		{nil, false},
		{[]string{"--log-level", "debug"}, false},
		{[]string{"--log-level", "warn"}, true},
		{[]string{"-log-level=error"}, true},
		{[]string{"--log-level=warn", "--log-level", "info"}, false},
		{[]string{"--policy", "log-level"}, false},
	} {
		if got := hidesListening(tc.args); got != tc.hide {
			t.Errorf("hidesListening(%q) = %v", tc.args, got)
		}
	}
	if !hasFlag([]string{"--block-size", "16", "-config=x.yaml"}, "config") || hasFlag([]string{"--configs", "x"}, "config") {
		t.Error("hasFlag")
	}
}

// Options that cannot work with several routers are refused before anything starts.
func TestRoutersOptionErrors(t *testing.T) {
	w, err := Regime("no-reuse", RegimeOptions{Requests: 4})
	if err != nil {
		t.Fatal(err)
	}
	logDir := t.TempDir()
	base := func() Options {
		return Options{SimBin: "/bin/sh", RouterBin: "/bin/sh", Replicas: 2, Policies: []string{"kv"}, Seeds: 1, Concurrency: 1,
			Tokens: Tokenizer{PerBlock: 16}, OutputScale: 1, LogDir: logDir}
	}
	for _, tc := range []struct {
		mod  func(*Options)
		want string
	}{
		{func(o *Options) { o.Routers = -1 }, "routers must be"},
		{func(o *Options) { o.Routers = 3; o.CaptureUnder = []string{"kv"} }, "capture needs one router"},
		{func(o *Options) { o.Routers = 2; o.RouterArgs = []string{"--config", "c.yaml"} }, "--config"},
		{func(o *Options) { o.RouterArgs = []string{"--log-level", "warn"} }, "kvrouter listening"},
	} {
		o := base()
		tc.mod(&o)
		if _, err := Replay(context.Background(), o, w); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", o, err, tc.want)
		}
	}
}

// TestReplayThroughThreeRouters replays a tiny siblings slice through three clustered kvrouter
// processes in front of two vllm-sim engines: every request succeeds, every router sees the
// other two, routed a third of the requests and published load batches its peers received.
func TestReplayThroughThreeRouters(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two vllm-sim and three kvrouter processes")
	}
	dir := buildBinaries(t)
	w, err := Regime("siblings", RegimeOptions{Requests: 24, Rate: 20, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{SimBin: filepath.Join(dir, "vllm-sim"), RouterBin: filepath.Join(dir, "kvrouter"), Replicas: 2, Routers: 3,
		Policies: []string{"kv"}, Seeds: 1, Concurrency: 16, Tokens: Tokenizer{PerBlock: 16},
		OutputScale: 1, MaxOutputTokens: 4, Model: "vllm-sim", LogDir: t.TempDir(), Drain: 15 * time.Second,
		SimArgs: []string{"--decode-ms-per-token", "2", "--num-gpu-blocks", "512"}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runs, err := Replay(ctx, o, w)
	if err != nil {
		t.Fatal(err)
	}
	r := runs[0]
	if s := Summarize(runs)[0]; s.Errors != 0 || s.CachedRatio.Mean <= 0 {
		t.Fatalf("%d errors %v, cached %v", s.Errors, s.FirstErrors, s.CachedRatio.Mean)
	}
	if r.Routers != 3 || len(r.RouterSync) != 3 {
		t.Fatalf("routers %d, sync figures %+v", r.Routers, r.RouterSync)
	}
	for _, s := range r.RouterSync {
		t.Logf("%+v", s)
		if s.Err != "" || s.Peers != 2 || s.Requests != 8 || s.SentBytes <= 0 || s.SentBatches <= 0 || s.ReceivedBytes <= 0 {
			t.Errorf("router %+v: want 2 peers, 8 requests, load batches sent and received", s)
		}
	}
}

// Every router is told the engines' block size, events or not, as the operator configures it;
// a --block-size among RouterArgs is kept as given.
func TestRouterArgsCarryTheBlockSize(t *testing.T) {
	o := Options{BlockSize: 16}
	for _, p := range []string{"kv", "kv" + NoEventsSuffix} {
		args := routerArgs(o, "engines.txt", p)
		if !slices.Equal(args[len(args)-2:], []string{"--block-size", "16"}) {
			t.Errorf("%s: %v, want --block-size 16", p, args)
		}
		if got := slices.Contains(args, "--no-events"); got != (p != "kv") {
			t.Errorf("%s: --no-events %v", p, got)
		}
	}
	o.RouterArgs = []string{"--block-size", "32"}
	if args := routerArgs(o, "engines.txt", "kv"); slices.Index(args, "16") >= 0 || !hasFlag(args, "block-size") {
		t.Errorf("RouterArgs' --block-size replaced: %v", args)
	}
}
