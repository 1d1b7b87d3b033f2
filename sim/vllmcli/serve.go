// Package vllmcli reads the command line of `vllm serve` into a vllm-sim configuration, so the
// simulator runs the engine command kvroute's operator renders, unchanged.
//
// Flags are vLLM's, spelt as its argparse takes them (--flag value, --flag=value, underscores
// for dashes, the short aliases -tp and -dp, unique prefixes). Those the simulator models set
// its configuration; those that only matter to a GPU (memory, dtypes, kernels, loading) are
// accepted and reported as ignored; the few whose effect it cannot give (TLS, a Unix socket,
// multi-node data parallelism, prefix caching off) are refused, as are flags vLLM does not have.
package vllmcli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/vllmrelease"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// WildcardHostEnv names the variable that gives the address a wildcard bind takes instead of
// every interface: the HTTP server without --host (or with 0.0.0.0 or ::) and kv-events
// endpoints with "*", "0.0.0.0" or "[::]". In a pod, where every pod has its own network, it
// stays unset; hack/podbacker sets it to each pod's loopback address so pods on one host bind
// the same rendered ports without colliding.
const WildcardHostEnv = "VLLM_SIM_WILDCARD_HOST"

// SimArgsEnv names the variable that holds the simulator's own flags (vllm-sim's syntax,
// separated by spaces: timing, faults, cache size) when it runs a `vllm serve` command line.
const SimArgsEnv = "VLLM_SIM_ARGS"

// Result is a parsed `vllm serve` command line.
type Result struct {
	Config vllmsim.Config
	// Ignored lists the flags accepted and not simulated, by name (values may be secrets:
	// --hf-token).
	Ignored []string
}

// Serve maps the arguments after `vllm serve` onto base (the simulator's own settings) and
// returns the configuration. Every argument is first expanded as the kubelet expands $(VAR)
// from the container's environment (env); in a pod the kubelet has done it already, so only
// references it left alone are looked up again. The fields vLLM's flags own take vLLM's
// defaults when their flag is absent: every interface, port 8000, block size 16, sha256,
// one rank, no KV events, vLLM's empty topic.
func Serve(base vllmsim.Config, args []string, env func(string) (string, bool)) (Result, error) {
	var p parser
	for _, a := range args {
		p.args = append(p.args, Expand(a, env))
	}
	cfg := base
	cfg.Host, cfg.Port, cfg.BlockSize, cfg.HashAlgo, cfg.DataParallelSize = "", 8000, 16, "sha256", 1
	cfg.KVEventsPort, cfg.KVEventsConnect, cfg.KVReplayPort, cfg.KVEventsBind, cfg.KVReplayBind, cfg.KVSnapshotPort = 0, "", 0, "", "", 0
	cfg.OmitPromptTokensDetails = true
	empty := ""
	cfg.KVEventsTopic = &empty
	var st serveState
	for p.i < len(p.args) {
		a := p.args[p.i]
		p.i++
		if a == "--" {
			st.model = append(st.model, p.args[p.i:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" || isNumber(a) {
			st.model = append(st.model, a)
			continue
		}
		if a == "-h" || a == "--help" || strings.HasPrefix(a, "--help=") {
			return Result{}, ErrHelp
		}
		if strings.HasPrefix(a, "-O") && a != "-O" {
			// -O3, -O=3, -O.level=3: vLLM's compilation shorthand, nothing a simulator runs.
			p.ignored = append(p.ignored, a)
			continue
		}
		f, spelt, value, hasValue, err := p.flag(a)
		if err != nil {
			return Result{}, err
		}
		vals, err := p.values(f, spelt, value, hasValue)
		if err != nil {
			return Result{}, err
		}
		negated := strings.HasPrefix(spelt, "--no-")
		switch f.use {
		case ignored:
			p.ignored = append(p.ignored, spelt)
			continue
		case unsupported:
			if long := "--" + f.name; spelt != long {
				spelt += " (" + long + ")"
			}
			return Result{}, fmt.Errorf("%s: vllm-sim does not simulate this vLLM flag", spelt)
		}
		if err := st.apply(&cfg, f.name, spelt, vals, negated); err != nil {
			return Result{}, err
		}
	}
	switch {
	case len(st.model) > 1:
		return Result{}, fmt.Errorf("unexpected arguments %q: `vllm serve` takes one model", st.model[1:])
	case len(st.served) > 1:
		return Result{}, fmt.Errorf("--served-model-name %q: vllm-sim serves one name", st.served)
	case len(st.served) == 1:
		cfg.Model = st.served[0]
	case len(st.model) == 1:
		cfg.Model = st.model[0] // vLLM serves a model under its path when no name is given
	}
	wild, _ := env(WildcardHostEnv)
	if !st.hostSet || isWildcardHost(cfg.Host) {
		cfg.Host = "0.0.0.0"
		if wild != "" {
			cfg.Host = wild
		}
	}
	if st.eventsJSON != "" {
		if err := applyKVEvents(&cfg, st.eventsJSON, wild); err != nil {
			return Result{}, err
		}
	}
	if st.transferJSON != "" {
		if err := applyKVTransfer(&cfg, st.transferJSON, env); err != nil {
			return Result{}, err
		}
	}
	return Result{Config: cfg, Ignored: p.ignored}, nil
}

// ErrHelp is returned for -h and --help.
var ErrHelp = errors.New("help requested")

type parser struct {
	args    []string
	i       int
	ignored []string
}

// flag resolves one option argument: its spec, how it was spelt (normalised), and an inline
// =value. Like vLLM's FlexibleArgumentParser, underscores in a long name read as dashes; like
// argparse, a unique prefix of a long name stands for it.
func (p *parser) flag(a string) (f *flagSpec, spelt, value string, hasValue bool, err error) {
	name := a
	if k, v, ok := strings.Cut(a, "="); ok {
		name, value, hasValue = k, v, true
	}
	if strings.HasPrefix(name, "--") {
		name = "--" + strings.ReplaceAll(name[2:], "_", "-")
		if strings.Contains(name, ".") {
			return nil, "", "", false, fmt.Errorf("%s: vllm-sim takes JSON flags whole (--%s '{...}'), not by key",
				a, strings.SplitN(name[2:], ".", 2)[0])
		}
	}
	if f = lookup[name]; f != nil {
		return f, name, value, hasValue, nil
	}
	if strings.HasPrefix(name, "--") {
		var matches []string
		for _, s := range spellings() {
			if strings.HasPrefix(s, name) {
				matches = append(matches, s)
			}
		}
		if len(matches) == 1 {
			return lookup[matches[0]], matches[0], value, hasValue, nil
		}
		if len(matches) > 1 {
			return nil, "", "", false, fmt.Errorf("%s: ambiguous, could be %s", name, strings.Join(slices.Sorted(slices.Values(matches)), ", "))
		}
	}
	msg := fmt.Sprintf("%s: not a flag of `vllm serve`", name)
	if near := nearest(name); near != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", near)
	}
	return nil, "", "", false, errors.New(msg)
}

// values takes the flag's values, from =value or the arguments that follow.
func (p *parser) values(f *flagSpec, spelt, value string, hasValue bool) ([]string, error) {
	switch f.arity {
	case boolOpt, storeTrue:
		if hasValue {
			if f.arity == boolOpt && !strings.HasPrefix(spelt, "--no-") {
				return nil, fmt.Errorf("%s=%s: vLLM takes %s or --no-%s, without a value", spelt, value, spelt, strings.TrimPrefix(spelt, "--"))
			}
			return nil, fmt.Errorf("%s=%s: %s takes no value", spelt, value, spelt)
		}
		return nil, nil
	case one:
		if hasValue {
			return []string{value}, nil
		}
		if p.i >= len(p.args) || p.isOption(p.args[p.i]) {
			return nil, fmt.Errorf("%s: expected one value", spelt)
		}
		p.i++
		return []string{p.args[p.i-1]}, nil
	case optional:
		if hasValue {
			return []string{value}, nil
		}
		if p.i < len(p.args) && !p.isOption(p.args[p.i]) {
			p.i++
			return []string{p.args[p.i-1]}, nil
		}
		return nil, nil
	default: // list
		if hasValue {
			return []string{value}, nil
		}
		var vals []string
		for p.i < len(p.args) && !p.isOption(p.args[p.i]) {
			vals = append(vals, p.args[p.i])
			p.i++
		}
		if len(vals) == 0 {
			return nil, fmt.Errorf("%s: expected at least one value", spelt)
		}
		return vals, nil
	}
}

// isOption is argparse's test: an argument starting with "-" is an option unless it reads as a
// negative number (vLLM has no option that looks like one).
func (p *parser) isOption(a string) bool {
	return strings.HasPrefix(a, "-") && a != "-" && !isNumber(a)
}

func isNumber(a string) bool {
	_, err := strconv.ParseFloat(a, 64)
	return err == nil
}

func setInt(dst *int, flag, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%s %q: want an integer", flag, v)
	}
	*dst = n
	return nil
}

// humanInt reads vLLM's human-readable integers (--max-model-len, --max-num-batched-tokens):
// 1k = 1000, 1K = 1024, likewise m/M and g/G; a fraction only with a decimal suffix (25.6k).
func humanInt(flag, v string) (int, error) {
	mult, num := 1.0, v
	if n := len(v); n > 0 {
		switch v[n-1] {
		case 'k':
			mult = 1e3
		case 'm':
			mult = 1e6
		case 'g':
			mult = 1e9
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult != 1 {
			num = v[:n-1]
		}
	}
	if i, err := strconv.Atoi(num); err == nil {
		return i * int(mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 1 || mult == 1<<10 || mult == 1<<20 || mult == 1<<30 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("%s %q: want an integer, optionally with k, m, g (x1000) or K, M, G (x1024)", flag, v)
	}
	return int(f * mult), nil
}

// loraName reads one --lora-modules entry: name=path, or vLLM's JSON form
// {"name": ..., "path": ..., "base_model_name": ...}.
func loraName(v string) (string, error) {
	if name, _, ok := strings.Cut(v, "="); ok && !strings.Contains(v, ",") {
		return name, nil
	}
	var m struct {
		Name          string `json:"name"`
		Path          string `json:"path"`
		BaseModelName string `json:"base_model_name"`
	}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil || m.Name == "" || m.Path == "" {
		return "", errors.New(`want NAME=PATH or {"name": ..., "path": ...}`)
	}
	return m.Name, nil
}

// kvEvents is vLLM's KVEventsConfig (vllm/config/kv_events.py), which refuses unknown keys.
// SGLang's and TensorRT-LLM's configs (publisher) mirror its fields; vLLM's adds the snapshot
// endpoint.
type kvEvents struct {
	publisher
	// SnapshotEndpoint is where newer vLLM binds its cache-snapshot ROUTER (rank r: port+r).
	SnapshotEndpoint *string `json:"snapshot_endpoint"`
}

// applyKVEvents sets the event sockets from --kv-events-config. vLLM binds the PUB endpoint when
// it holds "*" or "::" (or is ipc:// or inproc://) and connects to it otherwise; it always
// binds the replay endpoint. DP rank r uses each port + r.
func applyKVEvents(cfg *vllmsim.Config, raw, wild string) error {
	var kc kvEvents
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&kc); err != nil {
		return fmt.Errorf("--kv-events-config: %v", err)
	}
	enabled := kc.Enable != nil && *kc.Enable
	publisher := "null"
	if enabled {
		publisher = "zmq"
	}
	if kc.Publisher != nil {
		publisher = *kc.Publisher
	}
	if publisher != "zmq" && publisher != "null" {
		return fmt.Errorf("--kv-events-config: publisher %q: want zmq or null", publisher)
	}
	if kc.Topic != nil {
		cfg.KVEventsTopic = kc.Topic
	}
	if kc.BufferSteps != nil {
		cfg.BufferSteps = *kc.BufferSteps
	}
	if kc.HWM != nil {
		cfg.HWM = *kc.HWM
	}
	if !enabled || publisher != "zmq" {
		return nil // the engine records no events, or publishes them nowhere
	}
	endpoint := "tcp://*:5557"
	if kc.Endpoint != nil {
		endpoint = *kc.Endpoint
	}
	if vllmrelease.BindsEndpoint(endpoint) {
		cfg.KVEventsBind = wildcardTo(endpoint, wild)
	} else {
		cfg.KVEventsConnect = endpoint
	}
	if kc.ReplayEndpoint != nil && *kc.ReplayEndpoint != "" {
		cfg.KVReplayBind = wildcardTo(*kc.ReplayEndpoint, wild)
	}
	if kc.SnapshotEndpoint != nil && *kc.SnapshotEndpoint != "" {
		// The simulator binds its snapshot socket on the HTTP host; an endpoint on every
		// interface (or on that host) is the one it can honour.
		ep := *kc.SnapshotEndpoint
		rest, _ := strings.CutPrefix(ep, "tcp://")
		i := strings.LastIndex(rest, ":")
		port, err := strconv.Atoi(rest[i+1:])
		if !strings.HasPrefix(ep, "tcp://") || i < 0 || err != nil || port < 1 ||
			!(isWildcardHost(rest[:i]) || rest[:i] == cfg.Host) {
			return fmt.Errorf("--kv-events-config: snapshot_endpoint %q: vllm-sim binds it as tcp://*:PORT (or on --host)", ep)
		}
		cfg.KVSnapshotPort = port
	}
	return nil
}

func isWildcardHost(h string) bool {
	return h == "" || h == "0.0.0.0" || h == "::" || h == "[::]" || h == "*"
}

// wildcardTo puts host in place of a tcp endpoint's wildcard host, when host is given.
func wildcardTo(endpoint, host string) string {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	i := strings.LastIndex(rest, ":")
	if host == "" || !ok || i < 0 || !isWildcardHost(rest[:i]) {
		return endpoint
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "tcp://" + host + rest[i:]
}

// serveState is what Serve gathers from the command line beside the configuration itself.
type serveState struct {
	model, served []string
	eventsJSON    string
	transferJSON  string
	hostSet       bool
}

// apply sets what one mapped vLLM flag (name, as spelt, with its values) means for cfg.
func (st *serveState) apply(cfg *vllmsim.Config, name, spelt string, vals []string, negated bool) error {
	switch name {
	case "host":
		cfg.Host, st.hostSet = vals[0], true
	case "port":
		return setInt(&cfg.Port, spelt, vals[0])
	case "model":
		st.model = append(st.model, vals[0])
	case "served-model-name":
		st.served = vals
	case "block-size":
		return setInt(&cfg.BlockSize, spelt, vals[0])
	case "prefix-caching-hash-algo":
		cfg.HashAlgo = vals[0]
	case "enable-prefix-caching":
		if negated {
			return fmt.Errorf("%s: vllm-sim always caches prefixes (kvroute routes on that cache)", spelt)
		}
	case "data-parallel-size":
		return setInt(&cfg.DataParallelSize, spelt, vals[0])
	case "max-model-len":
		var err error
		cfg.MaxModelLen, err = humanInt(spelt, vals[0])
		return err
	case "max-num-batched-tokens":
		var err error
		cfg.MaxBatchedTokens, err = humanInt(spelt, vals[0])
		return err
	case "max-num-seqs":
		return setInt(&cfg.MaxNumSeqs, spelt, vals[0])
	case "num-gpu-blocks-override":
		return setInt(&cfg.NumGPUBlocks, spelt, vals[0])
	case "enable-prompt-tokens-details":
		cfg.OmitPromptTokensDetails = negated
	case "enable-lora":
		// Adapters are served when --lora-modules names them; the flag itself changes nothing.
	case "lora-modules":
		cfg.LoRAAdapters = nil
		for _, v := range vals {
			name, err := loraName(v)
			if err != nil {
				return fmt.Errorf("%s %q: %w", spelt, v, err)
			}
			cfg.LoRAAdapters = append(cfg.LoRAAdapters, name)
		}
	case "api-key":
		cfg.APIKeys = vals
	case "sse-keep-alive-interval":
		s, perr := strconv.ParseFloat(vals[0], 64)
		if perr != nil || !(s >= 0 && s <= 86400) {
			return fmt.Errorf("%s %q: want seconds within 0..86400", spelt, vals[0])
		}
		cfg.SSEKeepAliveInterval = time.Duration(s * float64(time.Second))
	case "kv-events-config":
		st.eventsJSON = vals[0]
	case "kv-transfer-config":
		st.transferJSON = vals[0]
	default:
		return fmt.Errorf("%s: mapped flag without a mapping (vllmcli bug)", spelt)
	}
	return nil
}
