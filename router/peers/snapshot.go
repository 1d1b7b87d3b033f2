package peers

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/router/fleet"
	"github.com/kvroute/kvroute/router/kvevents"
	"github.com/kvroute/kvroute/router/peersnap"
)

// ServeSnapshot answers a peer's GET /peer/snapshot: every stream a peer can start from and the
// approximate index of replicas without events. One at a time: a second asker gets 503 and
// tries another peer.
func (g *Group) ServeSnapshot(w http.ResponseWriter, _ *http.Request) {
	select {
	case g.snapServing <- struct{}{}:
		defer func() { <-g.snapServing }()
	default:
		http.Error(w, "a snapshot is being served; try another peer", http.StatusServiceUnavailable)
		return
	}
	b := peersnap.Encode(nil, g.takeSnapshot())
	g.met.Served.Inc()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	_, _ = w.Write(b)
}

func (g *Group) takeSnapshot() *peersnap.Snapshot {
	now := g.o.Now()
	sn := &peersnap.Snapshot{Taken: now.UnixNano(), Router: g.id, KeyScheme: peersnap.KeyScheme}
	reps, engines := g.d.Fleet.Snapshot()
	if g.d.Streams != nil {
		for _, st := range g.d.Streams.Snapshot() {
			e := engines[st.Engine]
			if e == nil {
				continue
			}
			st.Incarnation = e.Discovery().Incarnation
			sn.Streams = append(sn.Streams, st)
		}
	}
	for _, r := range reps {
		if r.Stream {
			continue
		}
		sn.Approx = append(sn.Approx, peersnap.Approx{Engine: r.Eng.Name, Rank: r.Rank, Entries: g.d.Ledger.ExportApprox(r.Load, maxApproxExport)})
	}
	return sn
}

// Bootstrap takes a ready peer's snapshot before the first engines are added. No ready peer
// within peerDiscoverWait: this router is alone, and the single-router rule holds.
func (g *Group) Bootstrap(ctx context.Context) {
	deadline := time.Now().Add(peerDiscoverWait)
	var tried map[string]bool
	for time.Now().Before(deadline) {
		for _, peer := range g.node.Peers() {
			if !peer.Ready || peer.SnapshotURL == "" || tried[peer.SnapshotURL] {
				continue
			}
			if tried == nil {
				tried = map[string]bool{}
			}
			tried[peer.SnapshotURL] = true
			sn, err := fetchSnapshot(ctx, peer.SnapshotURL, g.o.Config.MaxSnapshotBytes)
			if err != nil {
				g.met.Taken.WithLabelValues(peersnap.ResultFailed).Inc()
				g.log.Warn("peer snapshot not taken", "peer", peer.Name, "url", peer.SnapshotURL, "err", err)
				continue
			}
			g.useSnapshot(peer.Name, sn)
			g.met.Taken.WithLabelValues(peersnap.ResultApplied).Inc()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	g.met.Taken.WithLabelValues(peersnap.ResultNoPeer).Inc()
	g.log.Info("no ready router peer with a snapshot; starting from the engines' rings", "waited", peerDiscoverWait, "peers", len(g.node.Peers()))
}

func fetchSnapshot(ctx context.Context, url string, maxBytes int64) (*peersnap.Snapshot, error) {
	if maxBytes <= 0 {
		maxBytes = defaultMaxSnapshotBytes
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("peer answered %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("snapshot over peers.maxSnapshotBytes (%d)", maxBytes)
	}
	sn, err := peersnap.Decode(body, peersnap.Limits{})
	if err != nil {
		return nil, err
	}
	if sn.KeyScheme != peersnap.KeyScheme {
		return nil, fmt.Errorf("peer keys blocks with scheme %d, this router with %d", sn.KeyScheme, peersnap.KeyScheme)
	}
	return sn, nil
}

func (g *Group) useSnapshot(from string, sn *peersnap.Snapshot) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range sn.Streams {
		st := &sn.Streams[i]
		g.seeds[kvevents.StreamKey{Engine: st.Engine, Rank: st.Rank}] = st
	}
	for _, a := range sn.Approx {
		g.approx[kvevents.StreamKey{Engine: a.Engine, Rank: a.Rank}] = a.Entries
	}
	g.seededFrom = from
	timeout := g.o.Config.ReadyTimeout.Duration
	if timeout <= 0 {
		timeout = defaultPeerReadyTimeout
	}
	g.readyBy = g.o.Now().Add(timeout)
	g.peerRule.Store(true)
	g.log.Info("starting from a peer's snapshot", "peer", from, "streams", len(sn.Streams), "approximate_replicas", len(sn.Approx),
		"blocks", sn.Blocks(), "taken", time.Unix(0, sn.Taken).Format(time.RFC3339Nano))
}

// SeedStream hands the stream its snapshot once, if the engine is the incarnation it was taken
// from (fleet.Options.SeedStream; nil for a nil group: alone).
func (g *Group) SeedStream(engine string, rank int, incarnation string) *peersnap.Stream {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	k := kvevents.StreamKey{Engine: engine, Rank: rank}
	sn := g.seeds[k]
	delete(g.seeds, k)
	if sn == nil {
		return nil
	}
	if sn.Incarnation != incarnation {
		g.log.Warn("peer snapshot of the stream not used: the engine is another incarnation", "engine", engine, "rank", rank,
			"snapshot", sn.Incarnation, "now", incarnation)
		return nil
	}
	return sn
}

// SeedApprox loads a replica's approximate index from the snapshot (replicas without events;
// fleet.Options.SeedApprox).
func (g *Group) SeedApprox(r *fleet.Replica) {
	if g == nil {
		return
	}
	g.mu.Lock()
	k := kvevents.StreamKey{Engine: r.Eng.Name, Rank: r.Rank}
	es, ok := g.approx[k]
	delete(g.approx, k)
	if ok {
		g.approxSeeded[r.Name] = true
	}
	g.mu.Unlock()
	if ok {
		g.d.Ledger.ImportApprox(r.Load, es)
	}
}

// NotReady applies the peer rule while it holds: every stream exact or
// approximate-with-snapshot, every replica without events seeded from the snapshot. It returns
// "" once that is so or the ready timeout passed (and always for a nil group: alone); from then
// on only the single-router rule.
func (g *Group) NotReady() string {
	if g == nil || !g.peerRule.Load() {
		return ""
	}
	g.mu.Lock()
	by := g.readyBy
	g.mu.Unlock()
	if !g.o.Now().Before(by) {
		g.peerRule.Store(false)
		g.log.Warn("peer readiness timed out; ready by the single-router rule", "timeout", g.o.Config.ReadyTimeout.Duration)
		return ""
	}
	for _, r := range g.d.Fleet.Replicas() {
		if !r.Stream {
			g.mu.Lock()
			ok := g.approxSeeded[r.Name]
			g.mu.Unlock()
			if !ok {
				return "replica " + r.Name + " has no events and no approximate index from the peer snapshot yet"
			}
			continue
		}
		st, ok := g.d.Streams.Stats(r.Eng.Name, r.Rank)
		if !ok || !(st.State == kvevents.Exact || st.State == kvevents.Approximate && st.Seeded) {
			return "stream " + r.Name + " is not exact (nor approximate from a peer snapshot) yet"
		}
	}
	g.peerRule.Store(false)
	return ""
}
