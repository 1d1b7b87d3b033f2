package replay

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/router/config"
)

// routerProc is one running kvrouter and the addresses it reported binding.
type routerProc struct {
	*proc
	id                  string
	api, admin, cluster string // host:port; cluster only with peers
	extProc             string // host:port of the endpoint picker (--ext-proc-listen), if any
}

// listening is what kvrouter's "kvrouter listening" line reports (cmd/kvrouter).
type listening struct {
	API         string `json:"api"`
	Admin       string `json:"admin"`
	PeerCluster string `json:"peer_cluster"`
	ExtProc     string `json:"ext_proc"`
}

// textListening and textAttr read the line in kvrouter's default text format (log/slog's
// TextHandler: key=value, quoted only when a value holds spaces, quotes or '=', which host:port
// never does).
var (
	textListening = regexp.MustCompile(`(^|\s)msg="kvrouter listening"(\s|$)`)
	textAttr      = map[string]*regexp.Regexp{}
)

func init() {
	for _, k := range []string{"api", "admin", "peer_cluster", "ext_proc"} {
		textAttr[k] = regexp.MustCompile(`(?:^|\s)` + k + `=(\S+)`)
	}
}

// parseListening reads kvrouter's start-up line in either log format (--log-format text or
// json); false for any other line.
func parseListening(line string) (listening, bool) {
	if strings.HasPrefix(line, "{") {
		var rec struct {
			Msg string `json:"msg"`
			listening
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "kvrouter listening" || rec.API == "" || rec.Admin == "" {
			return listening{}, false
		}
		return rec.listening, true
	}
	if !textListening.MatchString(line) {
		return listening{}, false
	}
	get := func(k string) string {
		if m := textAttr[k].FindStringSubmatch(line); m != nil {
			return m[1]
		}
		return ""
	}
	l := listening{API: get("api"), Admin: get("admin"), PeerCluster: get("peer_cluster"), ExtProc: get("ext_proc")}
	return l, l.API != "" && l.Admin != ""
}

// hidesListening says whether kvrouter flags set a log level above info, which hides the
// "kvrouter listening" line the replay reads its addresses from (flag's forms: -x v, --x v,
// -x=v, --x=v; the last one given wins, as in flag.Parse).
func hidesListening(args []string) bool {
	level := ""
	for i, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "log-level" {
			continue
		}
		if !hasVal && i+1 < len(args) {
			val = args[i+1]
		}
		level = val
	}
	var l slog.Level
	return level != "" && l.UnmarshalText([]byte(level)) == nil && l > slog.LevelInfo
}

// startRouter runs kvrouter (bin with the arguments prefix, then its flags) with args (which
// must not fix --listen or --admin-listen: both get 127.0.0.1:0, before args) and returns once it logged the addresses it bound. The kernel
// picks every port, so no port found free and passed on can be taken by another process first
// (a clash make test could hit); a process that exits first fails the start at once, with its
// log.
func startRouter(ctx context.Context, bin string, prefix []string, id string, args []string, logPath string, timeout time.Duration) (*routerProc, error) {
	found := make(chan listening, 1)
	args = append(append(slices.Clone(prefix), "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"), args...)
	p, err := startProc("kvrouter "+id, bin, args, logPath, func(line string) {
		if l, ok := parseListening(line); ok {
			select {
			case found <- l:
			default: // only the first counts
			}
		}
	})
	if err != nil {
		return nil, err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case l := <-found:
		return &routerProc{proc: p, id: id, api: l.API, admin: l.Admin, cluster: l.PeerCluster, extProc: l.ExtProc}, nil
	case <-p.done:
		return nil, fmt.Errorf("kvrouter %s exited before listening (%v); its log (%s):\n%s", id, p.err, logPath, p.logTail())
	case <-timer.C:
		p.stop()
		return nil, fmt.Errorf("kvrouter %s logged no \"kvrouter listening\" line within %v; its log (%s):\n%s", id, timeout, logPath, p.logTail())
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
}

// hasFlag says whether args set the flag name (-name or --name, with or without =value).
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && n == name {
			return true
		}
	}
	return false
}

// peersConfig is a kvrouter config that holds only the peers block (everything else comes from
// flags, which override the file): router id on an embedded NATS server whose route port the
// kernel picks, with routes to the routers started before it. Naming every earlier router makes
// the mesh explicit, without relying on NATS's route gossip; each router's route port is read
// from its listening line before the next one starts. Peer and ready timeouts keep kvrouter's
// defaults (3 s, 10 s), the values a deployment runs.
func peersConfig(path, id string, routes []string) error {
	b, err := yaml.Marshal(map[string]*config.Peers{"peers": {
		ID: id, Subject: "kvroute.load.replay", ClusterListen: "127.0.0.1:0", Routes: routes,
	}})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// RouterSync is one router's view of its peers at the end of a run: who it saw and what the
// load sync cost (kvroute_router_peer* from its /metrics).
type RouterSync struct {
	ID            string  `json:"id"`
	Requests      float64 `json:"requests"` // requests it answered (kvroute_router_requests_total, every code)
	Peers         int     `json:"peers"`    // peers seen at the end of the run (router_peers in /debug/engines)
	SentBytes     float64 `json:"sent_bytes"`
	ReceivedBytes float64 `json:"received_bytes"`
	SentBatches   float64 `json:"sent_batches"`
	LostBatches   float64 `json:"lost_batches"`
	Dropped       float64 `json:"dropped_changes"`
	MeanLagMs     float64 `json:"mean_lag_ms"`     // flush to applied, over the run (0 with no batch received)
	Err           string  `json:"error,omitempty"` // the figures could not be read (the rest are zero)
}

// peersSeen is how many peers the router's /debug/engines lists (-1 when it could not be read).
func (r *routerProc) peersSeen(c *http.Client) int {
	resp, err := c.Get("http://" + r.admin + "/debug/engines")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var d struct {
		RouterPeers *struct {
			Peers []json.RawMessage `json:"peers"`
		} `json:"router_peers"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&d) != nil {
		return -1
	}
	if d.RouterPeers == nil {
		return 0
	}
	return len(d.RouterPeers.Peers)
}

// waitPeers waits until the router sees want peers.
func (r *routerProc) waitPeers(ctx context.Context, want int, timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for {
		got := r.peersSeen(c)
		if got == want {
			return nil
		}
		if r.exited() {
			return fmt.Errorf("kvrouter %s exited while waiting for its peers (%v); its log (%s):\n%s", r.id, r.err, r.logPath, r.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvrouter %s sees %d peers after %v, want %d", r.id, got, timeout, want)
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
}

// syncFigures reads the router's peer and load-sync figures.
func (r *routerProc) syncFigures() (RouterSync, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	s := RouterSync{ID: r.id, Peers: r.peersSeen(c)}
	resp, err := c.Get("http://" + r.admin + "/metrics")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		// "name{labels} value", no spaces in the labels of the series read here.
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		switch {
		case err != nil:
		case strings.HasPrefix(f[0], "kvroute_router_requests_total{"):
			s.Requests += v
		case strings.HasPrefix(f[0], "kvroute_router_peer"):
			m[f[0]] = v
		}
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	s.SentBytes = m[`kvroute_router_peer_sync_bytes_total{direction="sent"}`]
	s.ReceivedBytes = m[`kvroute_router_peer_sync_bytes_total{direction="received"}`]
	s.SentBatches = m[`kvroute_router_peer_sync_batches_total{direction="sent"}`]
	s.LostBatches = m["kvroute_router_peer_sync_lost_batches_total"]
	s.Dropped = m["kvroute_router_peer_sync_dropped_changes_total"]
	if n := m["kvroute_router_peer_sync_lag_seconds_count"]; n > 0 {
		s.MeanLagMs = m["kvroute_router_peer_sync_lag_seconds_sum"] / n * 1000
	}
	return s, nil
}
