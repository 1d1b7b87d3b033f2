package peers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/peersnap"
	"github.com/kvroute/kvroute/sim/simproc"
	"github.com/kvroute/kvroute/sim/simproc/simproctest"
)

// bins builds kvrouter and vllm-sim once per test binary.
func bins(t *testing.T) (kvrouter, sim string) {
	t.Helper()
	return testkit.Build(t, "./cmd/kvrouter"), testkit.Build(t, "./cmd/vllm-sim")
}

func TestMain(m *testing.M) { testkit.Main(m) }

// proc is a process started by a test, killed at its end.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  testkit.LockedBuffer
}

func start(t *testing.T, bin string, onLine func(string), args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			_, _ = p.log.Write([]byte(sc.Text() + "\n"))
			if onLine != nil {
				onLine(sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, stderr) // past a line over 1 MiB: keep the child unblocked
		// Wait only after the last line is read (it closes the pipe), so the log of a process
		// that exited holds its last words.
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s %v log:\n%s", filepath.Base(bin), args, p.logs())
		}
	})
	return p
}

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) logs() string { return p.log.String() }

// engine is one vllm-sim and the addresses it bound.
type engine struct {
	name string
	sim  *simproc.Sim
}

// startEngines starts n vllm-sim processes on ports the kernel picks; each is serving on return.
func startEngines(t *testing.T, n int, args ...string) []engine {
	t.Helper()
	_, bin := bins(t)
	var out []engine
	for i := range n {
		name := fmt.Sprintf("e%d", i)
		s := simproctest.Start(t, bin, simproc.Options{Name: "vllm-sim " + name}, append([]string{"--num-gpu-blocks", "2048"}, args...)...)
		out = append(out, engine{name: name, sim: s})
	}
	return out
}

// router is one kvrouter process.
type router struct {
	t          *testing.T
	id         string
	p          *proc
	api, admin string
	cluster    string // its NATS route address
}

// routerOpts are what a test changes of the harness's router config; the zero value is the
// suite's usual one.
type routerOpts struct {
	// natsURL is an external NATS server (peers.url) instead of the embedded one.
	natsURL string
	// readyTimeout is peers.readyTimeout (10s when 0).
	readyTimeout time.Duration
	// noEvents lists the engines without their event and replay sockets: their replicas are
	// scored from the approximate (decision-learned) index.
	noEvents bool
}

// routerConfig writes a kvrouter config for the engines, with peers when cluster or o.natsURL
// is set.
func routerConfig(t *testing.T, id string, es []engine, cluster string, routes []string, o routerOpts) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("blockSize: 16\nengines:\n")
	for _, e := range es {
		fmt.Fprintf(&b, "- name: %s\n  url: %s\n", e.name, e.sim.URL)
		if !o.noEvents {
			fmt.Fprintf(&b, "  events: [%s]\n  replay: [%s]\n", strings.Join(e.sim.Events, ", "), strings.Join(e.sim.Replay, ", "))
		}
	}
	if cluster != "" || o.natsURL != "" {
		ready := o.readyTimeout
		if ready == 0 {
			ready = 10 * time.Second
		}
		fmt.Fprintf(&b, "peers:\n  id: %s\n  subject: kvroute.load.test\n  peerTimeout: 1s\n  readyTimeout: %s\n", id, ready)
		if o.natsURL != "" {
			fmt.Fprintf(&b, "  url: %s\n", o.natsURL)
		} else {
			fmt.Fprintf(&b, "  clusterListen: %s\n", cluster)
		}
		if len(routes) > 0 {
			fmt.Fprintf(&b, "  routes: [%s]\n", strings.Join(routes, ", "))
		}
	}
	path := filepath.Join(t.TempDir(), id+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startRouter runs kvrouter with its config; peers when cluster is set ("" alone).
func startRouter(t *testing.T, id string, es []engine, cluster string, routes ...string) *router {
	t.Helper()
	return startRouterOpts(t, id, es, cluster, routerOpts{}, routes...)
}

// startRouterOpts is startRouter with the config's options.
func startRouterOpts(t *testing.T, id string, es []engine, cluster string, o routerOpts, routes ...string) *router {
	t.Helper()
	kv, _ := bins(t)
	cfg := routerConfig(t, id, es, cluster, routes, o)
	addrs := make(chan [2]string, 1)
	p := start(t, kv, func(line string) {
		var rec struct{ Msg, API, Admin string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "kvrouter listening" {
			addrs <- [2]string{rec.API, rec.Admin}
		}
	}, "--config", cfg, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json")
	r := &router{t: t, id: id, p: p, cluster: cluster}
	select {
	case a := <-addrs:
		r.api, r.admin = a[0], a[1]
	case <-p.done:
		t.Fatalf("kvrouter %s exited before listening:\n%s", id, p.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("kvrouter %s did not listen in 30s:\n%s", id, p.logs())
	}
	return r
}

// alive fails the test at once, with the router's log, when its process has exited: a wait on
// a dead router would otherwise run to its timeout and say nothing of why.
func (r *router) alive() {
	r.t.Helper()
	select {
	case <-r.p.done:
		r.t.Fatalf("kvrouter %s exited:\n%s", r.id, r.p.logs())
	default:
	}
}

func (r *router) ready() bool {
	r.t.Helper()
	r.alive()
	resp, err := http.Get("http://" + r.api + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// readyz is GET /readyz's status code and body (the reason when not ready).
func (r *router) readyz() (int, string) {
	r.t.Helper()
	r.alive()
	resp, err := http.Get("http://" + r.api + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// snapshot is what the router serves a starting peer (GET /peer/snapshot): its exact index per
// stream, exported from the index itself, and the approximate index of replicas without events.
func (r *router) snapshot() *peersnap.Snapshot {
	r.t.Helper()
	r.alive()
	resp, err := http.Get("http://" + r.admin + "/peer/snapshot")
	if err != nil {
		r.t.Fatalf("%s /peer/snapshot: %v", r.id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		r.t.Fatalf("%s /peer/snapshot: %d %v %s", r.id, resp.StatusCode, err, b)
	}
	sn, err := peersnap.Decode(b, peersnap.Limits{})
	if err != nil {
		r.t.Fatalf("%s /peer/snapshot: %v", r.id, err)
	}
	return sn
}

// debugEngines is what the tests read of GET /debug/engines.
type debugEngines struct {
	Engines []struct {
		Name  string `json:"name"`
		Ranks []struct {
			Stream       string         `json:"stream"`
			Seeded       bool           `json:"seeded"`
			Scoring      string         `json:"scoring"`
			Partial      bool           `json:"partial"`
			LastSeq      *uint64        `json:"last_seq"`
			Blocks       map[string]int `json:"blocks"`
			Inflight     inflight       `json:"inflight"`
			PeerInflight *inflight      `json:"peer_inflight"`
		} `json:"ranks"`
	} `json:"engines"`
	RouterPeers *struct {
		ID         string `json:"id"`
		SeededFrom string `json:"seeded_from"`
		Peers      []struct {
			Name string `json:"name"`
		} `json:"peers"`
		Routes     int `json:"routes"`
		SyncFaults struct {
			PublishErrors uint64 `json:"publish_errors"`
			LostBatches   uint64 `json:"lost_batches"`
		} `json:"sync_faults"`
	} `json:"router_peers"`
}

type inflight struct {
	Running       int64 `json:"running"`
	PrefillTokens int64 `json:"prefill_tokens"`
	DecodeTokens  int64 `json:"decode_tokens"`
}

func (r *router) engines() debugEngines {
	r.t.Helper()
	r.alive()
	var d debugEngines
	resp, err := http.Get("http://" + r.admin + "/debug/engines")
	if err != nil {
		r.t.Fatalf("%s /debug/engines: %v", r.id, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		r.t.Fatalf("%s /debug/engines: %v", r.id, err)
	}
	return d
}

// peers is how many peers the router sees.
func (r *router) peers() int {
	d := r.engines()
	if d.RouterPeers == nil {
		return 0
	}
	return len(d.RouterPeers.Peers)
}

// running sums the requests in flight the router sees: its own, and its peers'.
func (r *router) running() (own, peers int64) {
	for _, e := range r.engines().Engines {
		for _, rk := range e.Ranks {
			own += rk.Inflight.Running
			if rk.PeerInflight != nil {
				peers += rk.PeerInflight.Running
			}
		}
	}
	return own, peers
}

// index is each replica's GPU blocks and last seq, by engine name.
func (r *router) index() map[string]string {
	out := map[string]string{}
	for _, e := range r.engines().Engines {
		for _, rk := range e.Ranks {
			seq := "none"
			if rk.LastSeq != nil {
				seq = fmt.Sprint(*rk.LastSeq)
			}
			out[e.Name] = fmt.Sprintf("%s seq=%s gpu=%d", rk.Stream, seq, rk.Blocks["GPU"])
		}
	}
	return out
}

// routeAnswer is what the tests read of POST /debug/route (a decision scored, not sent).
type routeAnswer struct {
	Chosen     string `json:"chosen"`
	Candidates []struct {
		Replica     string `json:"replica"`
		Approximate bool   `json:"approximate"`
		// Cached is the tokens the decision expects cached there: the exact index's blocks,
		// or for an approximate replica the approximate index's when more, or the short-TTL
		// predicted index's (recent decisions, this router's and its peers'), whichever is most.
		Cached int `json:"predicted_cached_tokens"`
	} `json:"candidates"`
}

// cached is each candidate's expected cached tokens, by replica.
func (a routeAnswer) cached() map[string]int {
	out := map[string]int{}
	for _, c := range a.Candidates {
		out[c.Replica] = c.Cached
	}
	return out
}

// debugRoute asks the router where it would send a completion of the prompt.
func (r *router) debugRoute(toks []uint32) routeAnswer {
	r.t.Helper()
	r.alive()
	body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "prompt": toks, "max_tokens": 1})
	resp, err := http.Post("http://"+r.admin+"/debug/route", "application/json", bytes.NewReader(body))
	if err != nil {
		r.t.Fatalf("%s /debug/route: %v", r.id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a routeAnswer
	if resp.StatusCode != 200 || json.Unmarshal(b, &a) != nil {
		r.t.Fatalf("%s /debug/route: %d %s", r.id, resp.StatusCode, b)
	}
	return a
}

// prompt is n token ids that share their first shared ids with every prompt of the same group.
func prompt(group, i, shared, n int) []uint32 {
	out := make([]uint32, n)
	for j := range out {
		if j < shared {
			out[j] = uint32(1000 + (group*7919+j)%40000)
		} else {
			out[j] = uint32(50000 + (i*131+j)%100000)
		}
	}
	return out
}

// completion sends one completion of the prompt through the router and reads it to the end;
// it returns the engine that served it and the cached tokens the engine reported.
func (r *router) completion(toks []uint32, maxTokens int) (engine string, cached int, err error) {
	body, _ := json.Marshal(map[string]any{"model": "vllm-sim", "prompt": toks, "max_tokens": maxTokens, "stream": false})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.api+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", 0, fmt.Errorf("%s: %d %s", r.id, resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			Details *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(b, &out)
	if out.Usage.Details != nil {
		cached = out.Usage.Details.Cached
	}
	return resp.Header.Get("x-kvroute-engine"), cached, nil
}

// burst sends n requests through the routers in turn, conc at a time, and waits for them.
func burst(t *testing.T, rs []*router, n, conc int, mk func(i int) []uint32, maxTokens int) (failed int64) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, conc)
	var bad atomic.Int64
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, _, err := rs[i%len(rs)].completion(mk(i), maxTokens); err != nil {
				if bad.Add(1) == 1 {
					t.Logf("first failed request: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	return bad.Load()
}

// indexDiff compares two routers' snapshots stream by stream: the same streams, each at the
// same seq and batch identity, exact alike, with the same block size, KV groups and, per tier,
// the same set of blocks (engine hash, router key, extra copies). "" when equal; otherwise the
// differences (at most a few per stream).
func indexDiff(want, got *peersnap.Snapshot) string {
	type key struct {
		engine string
		rank   int
	}
	byKey := func(sn *peersnap.Snapshot) map[key]*peersnap.Stream {
		out := map[key]*peersnap.Stream{}
		for i := range sn.Streams {
			st := &sn.Streams[i]
			out[key{st.Engine, st.Rank}] = st
		}
		return out
	}
	w, g := byKey(want), byKey(got)
	var diffs []string
	for k, ws := range w {
		gs := g[k]
		if gs == nil {
			diffs = append(diffs, fmt.Sprintf("%s/%d: missing", k.engine, k.rank))
			continue
		}
		if ws.Exact != gs.Exact || ws.HaveSeq != gs.HaveSeq || ws.LastSeq != gs.LastSeq || ws.Identity != gs.Identity ||
			ws.BlockSize != gs.BlockSize || fmt.Sprint(ws.Groups) != fmt.Sprint(gs.Groups) {
			diffs = append(diffs, fmt.Sprintf("%s/%d: exact %v seq %d id %x bs %d groups %v, want exact %v seq %d id %x bs %d groups %v",
				k.engine, k.rank, gs.Exact, gs.LastSeq, gs.Identity, gs.BlockSize, gs.Groups, ws.Exact, ws.LastSeq, ws.Identity, ws.BlockSize, ws.Groups))
		}
		for tier := range ws.Tiers {
			wt, gt := entrySet(ws.Tiers[tier]), entrySet(gs.Tiers[tier])
			var only []string
			for e := range wt {
				if !gt[e] {
					only = append(only, fmt.Sprintf("-%x/%x+%d", e.Hash, e.Key, e.Extra))
				}
			}
			for e := range gt {
				if !wt[e] {
					only = append(only, fmt.Sprintf("+%x/%x+%d", e.Hash, e.Key, e.Extra))
				}
			}
			if len(only) > 0 || len(ws.Tiers[tier]) != len(gs.Tiers[tier]) {
				sort.Strings(only)
				diffs = append(diffs, fmt.Sprintf("%s/%d tier %d: %d blocks against %d, %d differ, e.g. %v",
					k.engine, k.rank, tier, len(gt), len(wt), len(only), only[:min(4, len(only))]))
			}
		}
	}
	for k := range g {
		if w[k] == nil {
			diffs = append(diffs, fmt.Sprintf("%s/%d: not in the peer's index", k.engine, k.rank))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

func entrySet(es []index.Entry) map[index.Entry]bool {
	out := make(map[index.Entry]bool, len(es))
	for _, e := range es {
		out[e] = true
	}
	return out
}
