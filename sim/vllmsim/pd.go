package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// KVTransfer is vLLM's --kv-transfer-config as the simulator plays it: a prefill/decode
// connector (vllm/config/kv_transfer.py, KVTransferConfig; the NIXL connector's protocol in
// vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py). A prefill-role request
// (kv_transfer_params.do_remote_decode) keeps its blocks after it finishes and answers with
// the parameters a decode engine pulls them with; a decode-role request
// (do_remote_prefill with remote_*) pulls them over the producer's side channel, waits the
// transfer time, and starts with the prompt computed.
//
// The side channel is the simulator's own (HTTP on the port vLLM's NIXL handshake listener
// takes, VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank): one POST reads a held request's blocks and
// releases them, as the decoder's NIXL read and its completion notification do.
type KVTransfer struct {
	Connector string // kv_connector: any name; the simulated protocol is the NIXL connector's
	Role      string // kv_role: kv_producer, kv_consumer or kv_both
	EngineID  string // engine_id; empty: a fresh id per process, as vLLM draws a uuid4
	// LoadFailurePolicy is kv_load_failure_policy: "recompute" (vLLM's default: a decode whose
	// blocks cannot be read computes the prompt itself) or "fail" (the request ends in error).
	LoadFailurePolicy string
	// SideChannelHost is what the answer gives as remote_host (VLLM_NIXL_SIDE_CHANNEL_HOST,
	// vLLM's default "localhost"); the listener binds it. Empty: the HTTP host.
	SideChannelHost string
	// SideChannelPort is rank 0's side-channel port (VLLM_NIXL_SIDE_CHANNEL_PORT, vLLM's
	// default 5600; rank r takes port+r); 0 picks a free port per rank.
	SideChannelPort int
	// AbortTimeout is how long a producer holds a finished request's blocks for a decoder
	// that never reads them (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, vLLM's default 480 s); wall time.
	AbortTimeout time.Duration
}

// Default KV-transfer figures. The bandwidth is the line rate of a 200 Gb/s RDMA NIC
// (ConnectX-6/7 class, what NIXL's UCX backend drives between nodes): 25 GB/s. The bytes per
// token are Llama-3.1-8B's bf16 KV cache: 2 (K and V) x 32 layers x 8 KV heads x 128 head dim
// x 2 bytes = 131072 (its config.json).
const (
	DefaultKVTransferBytesPerS = 25e9
	DefaultKVBytesPerToken     = 131072
	defaultNixlAbortTimeout    = 480 * time.Second
)

// kvTransferParams is the request's kv_transfer_params, the fields the NIXL connector reads.
type kvTransferParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	TPSize          int    `json:"tp_size"`
}

// complete says whether a decode-side request names everything a pull needs (the NIXL
// scheduler checks these keys in update_state_after_alloc and otherwise logs "Got invalid
// KVTransferParams" and computes the prompt itself).
func (p *kvTransferParams) complete() bool {
	return p.RemoteEngineID != "" && p.RemoteRequestID != "" && p.RemoteHost != "" && p.RemotePort > 0
}

// heldTransfer is a finished prefill request's blocks, kept referenced until a decoder reads
// them or the abort timeout passes.
type heldTransfer struct {
	blocks []*kvBlock
	ids    []int
	timer  *time.Timer
}

// pullRequest and pullAnswer are the simulator's side-channel messages.
type pullRequest struct {
	EngineID  string `json:"engine_id"`
	RequestID string `json:"request_id"`
	BlockIDs  []int  `json:"block_ids"`
}

type pullAnswer struct {
	Blocks int    `json:"blocks"`
	Error  string `json:"error,omitempty"`
}

// transferStats count the simulator's P/D outcomes for /metrics.
type transferStats struct {
	held, pulled, expired, loadFailures, invalidParams atomic.Uint64
}

// hold keeps a finished prefill request's blocks for a decoder (caller holds rk.mu).
func (rk *rank) hold(r *engineRequest) {
	ids := make([]int, len(r.blocks))
	for i, b := range r.blocks {
		ids[i] = b.id
	}
	h := &heldTransfer{blocks: r.blocks, ids: ids}
	r.blocks, r.numCachedBlocks = nil, 0
	r.xferBlockIDs = ids
	if rk.held == nil {
		rk.held = map[string]*heldTransfer{}
	}
	rk.held[r.id] = h
	rk.xfer.held.Add(1)
	gen := rk.gen
	h.timer = time.AfterFunc(rk.cfg.KVTransfer.AbortTimeout, func() {
		rk.mu.Lock()
		defer rk.mu.Unlock()
		if rk.gen != gen || rk.held[r.id] != h {
			return
		}
		delete(rk.held, r.id)
		rk.releaseHeld(h)
		rk.xfer.expired.Add(1)
		slog.Warn("vllm-sim: releasing KV blocks no decoder read within the abort timeout",
			"rank", rk.idx, "request", r.id, "blocks", len(ids), "timeout", rk.cfg.KVTransfer.AbortTimeout)
		rk.setGauges()
	})
}

// releaseHeld frees held blocks, last first like a finished request's (caller holds rk.mu).
func (rk *rank) releaseHeld(h *heldTransfer) {
	bs := slices.Clone(h.blocks)
	slices.Reverse(bs)
	rk.pool.release(bs)
}

// pull answers a decoder's read of a held request: the blocks must be the ones held; reading
// releases them (the decoder's completion notification).
func (rk *rank) pull(req pullRequest) (int, error) {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	h, ok := rk.held[req.RequestID]
	if !ok {
		return 0, fmt.Errorf("no blocks held for request %q (unknown, already read, or released after the abort timeout)", req.RequestID)
	}
	if !slices.Equal(h.ids, req.BlockIDs) {
		return 0, fmt.Errorf("request %q holds blocks %v, not %v", req.RequestID, h.ids, req.BlockIDs)
	}
	h.timer.Stop()
	delete(rk.held, req.RequestID)
	rk.releaseHeld(h)
	rk.xfer.pulled.Add(1)
	rk.setGauges()
	rk.poke()
	return len(h.ids), nil
}

// dropHeld forgets every held transfer (a restart: the process and its memory are gone).
func (rk *rank) dropHeld() {
	for _, h := range rk.held {
		h.timer.Stop()
	}
	rk.held = nil
}

// sideChannel serves one rank's pulls.
func (rk *rank) sideChannel(engineID string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /kv/pull", func(w http.ResponseWriter, r *http.Request) {
		var req pullRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, pullAnswer{Error: err.Error()})
			return
		}
		if req.EngineID != engineID {
			writeJSON(w, http.StatusConflict, pullAnswer{Error: fmt.Sprintf("engine %q is not %q", engineID, req.EngineID)})
			return
		}
		n, err := rk.pull(req)
		if err != nil {
			writeJSON(w, http.StatusNotFound, pullAnswer{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, pullAnswer{Blocks: n})
	})
	return mux
}

// startSideChannels binds each rank's side channel when a connector is configured.
func (s *Sim) startSideChannels(ctx context.Context) error {
	kt := s.cfg.KVTransfer
	if kt == nil {
		return nil
	}
	host := kt.SideChannelHost
	bindHost := host
	if host == "" || host == "localhost" {
		bindHost, host = s.cfg.Host, s.cfg.Host
		if kt.SideChannelHost == "localhost" {
			host = "localhost"
		}
	}
	for _, rk := range s.ranks {
		port := 0
		if kt.SideChannelPort > 0 {
			port = kt.SideChannelPort + rk.idx
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(bindHost, strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("vllmsim: side channel of rank %d: %w", rk.idx, err)
		}
		rk.sideHost, rk.sidePort = host, ln.Addr().(*net.TCPAddr).Port
		srv := &http.Server{Handler: rk.sideChannel(s.engineID), ReadHeaderTimeout: 10 * time.Second,
			BaseContext: func(net.Listener) context.Context { return ctx }}
		s.sideSrvs = append(s.sideSrvs, srv)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = srv.Serve(ln)
		}()
	}
	return nil
}

// SideChannelEndpoints are the bound side channels per rank (host:port), empty without a connector.
func (s *Sim) SideChannelEndpoints() []string {
	var out []string
	for _, rk := range s.ranks {
		if rk.sidePort > 0 {
			out = append(out, net.JoinHostPort(rk.sideHost, strconv.Itoa(rk.sidePort)))
		}
	}
	return out
}

// EngineID is the connector's engine id ("" without --kv-transfer-config).
func (s *Sim) EngineID() string { return s.engineID }

// transferParams is what a finished prefill request answers with: the NIXL scheduler's
// request_finished return value, field for field.
func (rk *rank) transferParams(engineID string, r *engineRequest) map[string]any {
	return map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_block_ids":  r.xferBlockIDs,
		"remote_engine_id":  engineID,
		"remote_request_id": r.id,
		"remote_host":       rk.sideHost,
		"remote_port":       rk.sidePort,
		"tp_size":           1,
	}
}

// pullClient reads remote blocks; the timeout bounds a decode whose producer hangs.
var pullClient = &http.Client{Timeout: 10 * time.Second}

// remotePrefill runs a decode-side request's transfer before it is scheduled: it reads the
// producer's blocks, waits the transfer time of the blocks this rank does not hold already,
// and reports whether the prompt arrives computed. A failed read follows
// kv_load_failure_policy: recompute (false, nil) or fail (an error for the client).
func (s *Sim) remotePrefill(ctx context.Context, rk *rank, p *kvTransferParams, er *engineRequest) (bool, error) {
	kt := s.cfg.KVTransfer
	fail := func(reason string) (bool, error) {
		rk.xfer.loadFailures.Add(1)
		slog.Warn("vllm-sim: KV load from the prefill engine failed", "request", er.id,
			"remote", net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort)), "reason", reason,
			"policy", kt.LoadFailurePolicy)
		if kt.LoadFailurePolicy == "fail" {
			return false, &apiError{http.StatusInternalServerError, "InternalServerError",
				"KV cache load from the prefill engine failed: " + reason, ""}
		}
		return false, nil
	}
	if !p.complete() {
		rk.xfer.invalidParams.Add(1)
		slog.Warn("vllm-sim: invalid kv_transfer_params; the request computes its prompt", "request", er.id)
		return false, nil
	}
	body, _ := json.Marshal(pullRequest{EngineID: p.RemoteEngineID, RequestID: p.RemoteRequestID, BlockIDs: p.RemoteBlockIDs})
	url := "http://" + net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort)) + "/kv/pull"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fail(err.Error())
	}
	resp, err := pullClient.Do(req)
	if err != nil {
		return fail(err.Error())
	}
	defer resp.Body.Close()
	var ans pullAnswer
	_ = json.NewDecoder(resp.Body).Decode(&ans)
	if resp.StatusCode != http.StatusOK {
		return fail(fmt.Sprintf("%d %s", resp.StatusCode, ans.Error))
	}
	rk.mu.Lock()
	local := len(rk.pool.lookup(er.blockHashes, len(er.blockHashes)))
	rk.mu.Unlock()
	moved := max(0, ans.Blocks-local)
	if d := s.transferTime(moved); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
		}
	}
	return true, nil
}

// transferTime is how long moving n blocks takes at the configured bandwidth (scaled like
// every simulated duration; a shrunk token stands for StepTokenScale tokens).
func (s *Sim) transferTime(blocks int) time.Duration {
	if blocks <= 0 || s.cfg.KVTransferBytesPerS <= 0 {
		return 0
	}
	scale := max(1, s.cfg.StepTokenScale)
	bytes := float64(blocks*s.cfg.BlockSize) * scale * float64(s.cfg.KVBytesPerToken)
	return s.cfg.scaled(math.Min(bytes/s.cfg.KVTransferBytesPerS, 3600))
}

// newEngineID is a fresh engine id (vLLM draws a uuid4 when engine_id is unset).
func newEngineID(seed uint64) string {
	return fmt.Sprintf("vllm-sim-%016x", seed)
}

// registerTransferMetrics exports the P/D outcomes (the simulator's own series; vLLM reports
// NIXL transfers under vllm:nixl_* with other labels).
func registerTransferMetrics(reg *prometheus.Registry, x *transferStats) {
	for _, c := range []struct {
		name, help string
		v          *atomic.Uint64
	}{
		{"vllm_sim_kv_transfer_held_total", "Prefill requests whose blocks were held for a decoder.", &x.held},
		{"vllm_sim_kv_transfer_pulled_total", "Held transfers a decoder read.", &x.pulled},
		{"vllm_sim_kv_transfer_expired_total", "Held transfers released after the abort timeout, never read.", &x.expired},
		{"vllm_sim_kv_transfer_load_failures_total", "Decode requests whose remote blocks could not be read.", &x.loadFailures},
		{"vllm_sim_kv_transfer_invalid_params_total", "Decode requests with incomplete kv_transfer_params.", &x.invalidParams},
	} {
		v := c.v
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(v.Load()) }))
	}
}
