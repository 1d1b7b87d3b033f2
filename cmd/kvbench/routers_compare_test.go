package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/sim/replay"
)

// routersCase is one replay regime or trace slice, with the kvbench replay flags that
// docs/benchmarks.md measures it with.
type routersCase struct {
	name string
	args []string
}

var routersCases = []routersCase{
	{"hot-prefix", []string{"--regime", "hot-prefix", "--replicas", "4"}},
	{"siblings", []string{"--regime", "siblings", "--replicas", "4"}},
	{"tenants", []string{"--regime", "tenants", "--replicas", "4"}},
	{"no-reuse", []string{"--regime", "no-reuse", "--rate", "8", "--duration", "15s", "--replicas", "4"}},
	{"scale-up", []string{"--regime", "scale-up", "--replicas", "8"}},
	{"llmd-shared-prefix", []string{"--trace", "../../testdata/traces/synthetic/llmd_shared_prefix_150x5_6000_1200_1000.jsonl", "--replicas", "4", "--speed", "2"}},
	{"conversation", []string{"--trace", "../../testdata/traces/mooncake/conversation_trace.jsonl", "--replicas", "4", "--speed", "1.5", "--duration", "20s"}},
	// The same trace over three times the span: the 20 s slice is 92 requests, so its balance
	// moves in steps of 0.043 and one router's own balance varies 1.17-1.74 between seeds, too
	// coarse for a ratio within 5% (docs/router.md, "Several router replicas").
	{"conversation-60s", []string{"--trace", "../../testdata/traces/mooncake/conversation_trace.jsonl", "--replicas", "4", "--speed", "1.5", "--duration", "60s"}},
}

// routersRun is one (case, seed, routers) replay's figures, a line of KVROUTE_ROUTERS_RESULTS.
type routersRun struct {
	Case     string  `json:"case"`
	Seed     int     `json:"seed"`
	Routers  int     `json:"routers"`
	Cached   float64 `json:"cached"`    // engines' cached tokens / prompt tokens
	MaxShare float64 `json:"max_share"` // busiest engine's requests / fair share
	// WorkShare is the busiest engine's uncached prompt tokens / fair share (0 in results
	// recorded before it was).
	WorkShare float64 `json:"work_share,omitempty"`
	TTFTP90   float64 `json:"ttft_p90_s"`
	Errors    int     `json:"errors"`
	// The load sync, all routers: bytes published per request replayed, mean lag, fewest peers
	// a router saw at the end, batches lost in transit and changes dropped unpublished.
	SyncBytesPerRequest float64 `json:"sync_bytes_per_request"`
	SyncLagMs           float64 `json:"sync_lag_ms"`
	FewestPeers         int     `json:"fewest_peers"`
	LostBatches         float64 `json:"lost_batches"`
	DroppedChanges      float64 `json:"dropped_changes"`
}

// TestRoutersOneAndThree is issue 24's paired comparison: every replay regime and two trace
// slices, kv policy, replayed through 1 router and through 3 peered routers (request i to
// router i mod 3), the two interleaved within each seed (their order alternating by seed) on
// fresh engines, each exactly `kvbench replay <case flags> --policies kv --seeds 1 --first-seed S
// --routers N`. Per seed it takes the ratio 3 routers / 1 router of the cached-token ratio, of
// the balance (busiest engine's requests over a fair share) and of TTFT p90, and reports each
// ratio's mean with its 95% t-interval over the seeds. A measurement, not a check (figures in
// docs/router.md, "Several router replicas"):
//
//	KVROUTE_ROUTERS_COMPARE=1 go test -count=1 -timeout 120m -run TestRoutersOneAndThree -v ./cmd/kvbench/
//
// KVROUTE_ROUTERS_SEEDS (5) and KVROUTE_ROUTERS_FIRST_SEED (1) choose the seeds,
// KVROUTE_ROUTERS_CASES=a,b the cases; KVROUTE_ROUTERS_RESULTS=FILE appends every run to FILE
// (JSON lines) and summarises every run in it, so more seeds can be added later.
func TestRoutersOneAndThree(t *testing.T) {
	if os.Getenv("KVROUTE_ROUTERS_COMPARE") == "" {
		t.Skip("a measurement; set KVROUTE_ROUTERS_COMPARE=1")
	}
	seeds, first := envInt(t, "KVROUTE_ROUTERS_SEEDS", 5), envInt(t, "KVROUTE_ROUTERS_FIRST_SEED", 1)
	cases := routersCases
	if only := os.Getenv("KVROUTE_ROUTERS_CASES"); only != "" {
		cases = nil
		for _, c := range routersCases {
			for _, n := range strings.Split(only, ",") {
				if n == c.name {
					cases = append(cases, c)
				}
			}
		}
	}
	binDir := t.TempDir()
	for _, b := range []string{"vllm-sim"} { // the routers are this test binary's (TestMain)
		if out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, b), "../"+b).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
	}
	resultsFile := os.Getenv("KVROUTE_ROUTERS_RESULTS")
	var runs []routersRun
	for seed := first; seed < first+seeds; seed++ {
		order := []int{1, 3}
		if seed%2 == 0 {
			order = []int{3, 1}
		}
		for _, c := range cases {
			for _, n := range order {
				r := replayRouters(t, binDir, c, seed, n)
				t.Logf("%s seed %d, %d routers: cached %.4f, max_share %.3f, work_share %.3f, ttft p90 %.3fs, errors %d, sync %.0f B/request, lag %.2f ms, fewest peers %d, %.0f lost batches, %.0f dropped changes",
					c.name, seed, n, r.Cached, r.MaxShare, r.WorkShare, r.TTFTP90, r.Errors, r.SyncBytesPerRequest, r.SyncLagMs, r.FewestPeers, r.LostBatches, r.DroppedChanges)
				runs = append(runs, r)
				if resultsFile != "" {
					appendJSONLine(t, resultsFile, r)
				}
			}
		}
	}
	if resultsFile != "" {
		runs = readRoutersRuns(t, resultsFile)
	}
	t.Log("\n" + routersTable(runs, cases))
}

// replayRouters runs one case for one seed through n routers and reads kvbench's JSON.
func replayRouters(t *testing.T, binDir string, c routersCase, seed, n int) routersRun {
	t.Helper()
	args := append([]string{"replay"}, c.args...)
	args = append(args, "--policies", "kv", "--seeds", "1", "--first-seed", strconv.Itoa(seed),
		"--routers", strconv.Itoa(n), "--bin-dir", binDir, "--json")
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("kvbench %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
	}
	var out replayOutput
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || len(out.Results) != 1 || len(out.Runs) != 1 {
		t.Fatalf("kvbench %s: %v\n%s", strings.Join(args, " "), err, stdout.String())
	}
	s, run := out.Results[0], out.Runs[0]
	r := routersRun{Case: c.name, Seed: seed, Routers: n, Cached: s.CachedRatio.Mean, MaxShare: s.MaxEngineShare.Mean, WorkShare: s.MaxEngineWorkShare.Mean,
		TTFTP90: s.TTFTP90.Mean, Errors: s.Errors, FewestPeers: n - 1}
	var bytes, lag float64
	for _, rs := range run.RouterSync {
		bytes += rs.SentBytes
		lag += rs.MeanLagMs / float64(len(run.RouterSync))
		r.FewestPeers = min(r.FewestPeers, rs.Peers)
		r.LostBatches += rs.LostBatches
		r.DroppedChanges += rs.Dropped
	}
	if requests := s.Requests; requests > 0 {
		r.SyncBytesPerRequest = bytes / float64(requests)
	}
	r.SyncLagMs = lag
	return r
}

// routersTable is the comparison as a Markdown table: per case, both set-ups' mean figures and
// the paired per-seed ratios (3 routers / 1 router), mean [95% t-interval].
func routersTable(runs []routersRun, cases []routersCase) string {
	var b strings.Builder
	b.WriteString("| case | seeds | cached, 1 router | cached, 3 routers | cached ratio 3/1 | max_share, 1 | max_share, 3 | balance ratio 3/1 | work balance ratio 3/1 | TTFT p90 ratio 3/1 | sync B/request | sync lag | errors |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cases {
		one, three := map[int]routersRun{}, map[int]routersRun{}
		for _, r := range runs {
			switch {
			case r.Case != c.name:
			case r.Routers == 1:
				one[r.Seed] = r
			case r.Routers == 3:
				three[r.Seed] = r
			}
		}
		var c1, c3, m1, m3, hit, bal, work, ttft, sync, lag []float64
		errs := 0
		for seed, a := range one {
			z, ok := three[seed]
			if !ok {
				continue
			}
			c1, c3, m1, m3 = append(c1, a.Cached), append(c3, z.Cached), append(m1, a.MaxShare), append(m3, z.MaxShare)
			hit = append(hit, z.Cached/a.Cached) // NaN (left out) when neither cached anything
			bal = append(bal, z.MaxShare/a.MaxShare)
			if a.WorkShare > 0 && z.WorkShare > 0 {
				work = append(work, z.WorkShare/a.WorkShare)
			}
			ttft = append(ttft, z.TTFTP90/a.TTFTP90)
			sync, lag = append(sync, z.SyncBytesPerRequest), append(lag, z.SyncLagMs)
			errs += a.Errors + z.Errors
		}
		if len(hit) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %.3f | %.3f | %s | %.3f | %.3f | %s | %s | %s | %.0f | %.1f ms | %d |\n", c.name, len(hit),
			mean(c1), mean(c3), ratioCI(hit, "- (nothing cached)"), mean(m1), mean(m3), ratioCI(bal, "-"), ratioCI(work, "- (not recorded)"),
			ratioCI(ttft, "-"), mean(sync), mean(lag), errs)
	}
	return b.String()
}

// ratioCI prints a per-seed ratio's mean and 95% t-interval (replay.TInterval), or none when
// there is no ratio to take.
func ratioCI(xs []float64, none string) string {
	iv := replay.TInterval(xs)
	if math.IsNaN(iv.Mean) {
		return none
	}
	return fmt.Sprintf("%.3f [%.3f, %.3f]", iv.Mean, iv.Lo, iv.Hi)
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a number >= 1", name, v)
	}
	return n
}

func appendJSONLine(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}

func readRoutersRuns(t *testing.T, path string) []routersRun {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []routersRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r routersRun
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, r)
	}
	return out
}

// The comparison pairs runs by seed and divides 3 routers by 1.
func TestRoutersTable(t *testing.T) {
	runs := []routersRun{
		{Case: "a", Seed: 1, Routers: 1, Cached: 0.5, MaxShare: 1, WorkShare: 1, TTFTP90: 1},
		{Case: "a", Seed: 1, Routers: 3, Cached: 0.55, MaxShare: 1.1, WorkShare: 1.2, TTFTP90: 2, SyncBytesPerRequest: 500},
		{Case: "a", Seed: 2, Routers: 3, Cached: 0.45, MaxShare: 0.9, WorkShare: 1, TTFTP90: 1},
		{Case: "a", Seed: 2, Routers: 1, Cached: 0.5, MaxShare: 1, WorkShare: 1, TTFTP90: 1},
		{Case: "a", Seed: 3, Routers: 1, Cached: 0.9, MaxShare: 1, TTFTP90: 1}, // unpaired: left out
		{Case: "b", Seed: 1, Routers: 1}, {Case: "b", Seed: 1, Routers: 3},
	}
	got := routersTable(runs, []routersCase{{name: "a"}, {name: "b"}})
	for _, want := range []string{"| a | 2 | 0.500 | 0.500 | 1.000 [0.900, 1.100] |", "| 1.000 [0.900, 1.100] | 1.100 [1.000, 1.200] | 1.500 [1.000, 2.000] | 250 |", "| b | 1 | 0.000 | 0.000 | - (nothing cached) |", "| - (not recorded) |"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}
