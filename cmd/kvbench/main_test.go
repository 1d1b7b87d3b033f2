package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testTrace = "../../testdata/traces/mooncake/synthetic_trace.jsonl"

func kvbench(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	rc := run(args, &out, &errb)
	return out.String(), errb.String(), rc
}

func TestCacheJSONShapeAndDeterminism(t *testing.T) {
	args := []string{"cache", "--trace", testTrace, "--replicas", "4", "--capacity-blocks", "2400",
		"--policies", "kv,round-robin", "--json"}
	a, stderr, rc := kvbench(t, args...)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr)
	}
	b, _, _ := kvbench(t, args...)
	if a != b {
		t.Error("two runs printed different JSON")
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(a), &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"trace", "replicas", "capacity_blocks", "results", "ceilings", "ranking"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("missing %q", k)
		}
	}
	if doc["replicas"].(float64) != 4 || doc["capacity_blocks"].(float64) != 2400 || doc["trace"] != "synthetic_trace.jsonl" {
		t.Errorf("header %v", doc)
	}
	res := doc["results"].([]any)
	if len(res) != 2 || res[0].(map[string]any)["policy"] != "kv" {
		t.Fatalf("results %v", res)
	}
	for _, r := range res {
		m := r.(map[string]any)
		if len(m) != 7 {
			t.Errorf("result has fields %v, want exactly the 7 of the published JSON shape", m)
		}
		for _, k := range []string{"policy", "hit_rate_blocks", "hit_rate_tokens", "imbalance", "imbalance_p95", "ttft_p50_s", "ttft_p90_s"} {
			if _, ok := m[k]; !ok {
				t.Errorf("result lacks %q", k)
			}
		}
	}
	c := doc["ceilings"].(map[string]any)
	if c["global-lru"].(float64) <= 0 || c["belady"].(float64) < c["global-lru"].(float64) {
		t.Errorf("ceilings %v", c)
	}
}

func TestCacheTableAndReport(t *testing.T) {
	dir := t.TempDir()
	out, stderr, rc := kvbench(t, "cache", "--trace", testTrace, "--policies", "kv,load", "--report", dir)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr)
	}
	if !strings.Contains(out, "hit_blocks") || !strings.Contains(out, "global-lru") {
		t.Errorf("table: %s", out)
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	if strings.Count(s, "<svg") < 4 || strings.Contains(s, "<script") || strings.Contains(s, "http://cdn") {
		t.Errorf("report: %d plots, scripts %v", strings.Count(s, "<svg"), strings.Contains(s, "<script"))
	}
	if !strings.Contains(s, "kvbench cache --trace") {
		t.Error("report lacks the command line")
	}
}

// A generated regime runs through the fleet model: on hot-prefix every policy's hit rate is the
// shared prefix's share of each prompt once every replica holds it (12 of 15 blocks).
func TestCacheRunsARegime(t *testing.T) {
	out, stderr, rc := kvbench(t, "cache", "--regime", "hot-prefix", "--regime-requests", "400", "--policies", "kv,round-robin", "--json")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr)
	}
	var got struct {
		Trace   string `json:"trace"`
		Results []struct {
			Policy string  `json:"policy"`
			Hit    float64 `json:"hit_rate_blocks"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Trace != "regime hot-prefix" || len(got.Results) != 2 {
		t.Fatalf("output %s", out)
	}
	for _, r := range got.Results {
		if r.Hit < 0.7 || r.Hit > 0.8 {
			t.Errorf("%s: hit rate %v on hot-prefix, want 0.7-0.8 (12 of 15 blocks less the first copies)", r.Policy, r.Hit)
		}
	}
}

// The table ranks the policies best first by block hit rate, whatever order --policies gave, and
// the JSON names the same ranking while keeping its results in --policies order.
func TestCacheRanksPolicies(t *testing.T) {
	args := []string{"cache", "--trace", testTrace, "--replicas", "4", "--capacity-blocks", "2400",
		"--policies", "random,kv,round-robin"}
	table, stderr, rc := kvbench(t, args...)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, stderr)
	}
	js, _, _ := kvbench(t, append(args, "--json")...)
	var doc struct {
		Results []struct {
			Policy string  `json:"policy"`
			Hit    float64 `json:"hit_rate_blocks"`
		} `json:"results"`
		Ranking []string `json:"ranking"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 3 || doc.Results[0].Policy != "random" || len(doc.Ranking) != 3 {
		t.Fatalf("json %s", js)
	}
	hit := map[string]float64{}
	for _, r := range doc.Results {
		hit[r.Policy] = r.Hit
	}
	for i := 1; i < len(doc.Ranking); i++ {
		if hit[doc.Ranking[i-1]] < hit[doc.Ranking[i]] {
			t.Errorf("ranking %v is not best first: %v", doc.Ranking, hit)
		}
	}
	if hit["kv"] <= hit["random"] {
		t.Fatalf("kv %.3f does not beat random %.3f on the synthetic trace; the ranking test needs it to", hit["kv"], hit["random"])
	}
	if !strings.Contains(table, "best per column: hit_blocks "+doc.Ranking[0]+" ") {
		t.Errorf("table lacks the best line for %s:\n%s", doc.Ranking[0], table)
	}
	var rows []string
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && (f[1] == "random" || f[1] == "kv" || f[1] == "round-robin") {
			rows = append(rows, f[0]+" "+f[1])
		}
	}
	want := []string{"1 " + doc.Ranking[0], "2 " + doc.Ranking[1], "3 " + doc.Ranking[2]}
	if strings.Join(rows, ",") != strings.Join(want, ",") {
		t.Errorf("table rows %v, want %v", rows, want)
	}
}

// scale-up runs through the fleet model since the model replays fleet membership: the first
// third of its requests on half the replicas (it was refused while the model's fleet was fixed).
func TestCacheRunsTheScaleUpRegime(t *testing.T) {
	out, errOut, rc := kvbench(t, "cache", "--regime", "scale-up", "--regime-requests", "300", "--replicas", "4", "--policies", "kv,round-robin", "--json")
	if rc != 0 {
		t.Fatalf("exit %d: %s", rc, errOut)
	}
	if !strings.Contains(out, `"policy": "kv"`) && !strings.Contains(out, `"policy":"kv"`) {
		t.Errorf("no kv result in %s", out)
	}
}

func TestBadInvocations(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		rc   int
	}{
		"no subcommand":    {nil, 2},
		"unknown":          {[]string{"nope"}, 2},
		"no trace":         {[]string{"cache"}, 2},
		"missing file":     {[]string{"cache", "--trace", "does-not-exist.jsonl"}, 1},
		"unknown policy":   {[]string{"cache", "--trace", testTrace, "--policies", "kv,bogus"}, 2},
		"zero speed":       {[]string{"cache", "--trace", testTrace, "--speed", "0"}, 2},
		"bad flag":         {[]string{"cache", "--frobnicate"}, 2},
		"trace and regime": {[]string{"cache", "--trace", testTrace, "--regime", "no-reuse"}, 2},
		"unknown regime":   {[]string{"cache", "--regime", "bogus"}, 2},
		"replay bad flag":  {[]string{"replay", "--frobnicate"}, 2},
		"replay no trace":  {[]string{"replay"}, 2},
		"replay speed":     {[]string{"replay", "--trace", testTrace, "--speed", "0"}, 2},
		"replay policy":    {[]string{"replay", "--trace", testTrace, "--policies", "bogus"}, 2},
		"replay stray arg": {[]string{"replay", "--trace", testTrace, "stray"}, 2},
	} {
		if _, stderr, rc := kvbench(t, c.args...); rc != c.rc {
			t.Errorf("%s: exit %d, want %d (%s)", name, rc, c.rc, stderr)
		}
	}
}
