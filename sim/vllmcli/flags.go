package vllmcli

import (
	"strings"

	"github.com/kvroute/kvroute/internal/vllmrelease"
)

// arity is how many values a flag takes, as vLLM's argparse declares it.
type arity = vllmrelease.Arity

const (
	boolOpt   = vllmrelease.BoolOpt
	storeTrue = vllmrelease.StoreTrue
	one       = vllmrelease.One
	list      = vllmrelease.List
	optional  = vllmrelease.Optional
)

// use is what vllm-sim does with a flag.
type use int

const (
	ignored     use = iota // accepted; changes nothing the simulator models (GPU, kernels, loading, logging)
	mapped                 // sets the simulator's configuration (serve.go)
	unsupported            // a vLLM flag whose effect the simulator cannot give; refused rather than faked
)

type flagSpec struct {
	name    string // long name with dashes, without "--"
	aliases []string
	arity   arity
	use     use
}

// mappedFlags set the simulator's configuration (serveState.apply); every other flag of the
// pinned vLLM is accepted and ignored unless unsupportedFlags names it.
var mappedFlags = []string{
	"host", "port", "api-key", "lora-modules", "enable-prompt-tokens-details",
	"sse-keep-alive-interval", "model", "max-model-len", "served-model-name",
	"data-parallel-size", "block-size", "num-gpu-blocks-override", "enable-prefix-caching",
	"prefix-caching-hash-algo", "enable-lora", "max-num-batched-tokens", "max-num-seqs",
	"kv-events-config", "kv-transfer-config",
}

// unsupportedFlags are vLLM flags whose effect the simulator cannot give (other processes'
// ranks, sockets, TLS, a config file): refused rather than faked.
var unsupportedFlags = []string{
	"headless", "config", "uds", "ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "tokens-only",
	"data-parallel-rank", "data-parallel-start-rank", "data-parallel-size-local",
	"data-parallel-address", "data-parallel-rpc-port", "data-parallel-hybrid-lb",
}

// vllmFlags are the flags of `vllm serve` of the pinned release (internal/vllmrelease.Flags, the
// one list the operator's argument check reads too), each with what the simulator does with it.
var vllmFlags = func() []flagSpec {
	uses := map[string]use{}
	for _, n := range mappedFlags {
		uses[n] = mapped
	}
	for _, n := range unsupportedFlags {
		uses[n] = unsupported
	}
	out := make([]flagSpec, len(vllmrelease.Flags))
	for i, f := range vllmrelease.Flags {
		out[i] = flagSpec{name: f.Name, aliases: f.Aliases, arity: f.Arity, use: uses[f.Name]}
	}
	return out
}()

// lookup indexes vllmFlags by every spelling an argument can take: "--name", "--no-name" for
// BooleanOptionalAction flags, "-alias".
var lookup = func() map[string]*flagSpec {
	m := map[string]*flagSpec{}
	for i := range vllmFlags {
		f := &vllmFlags[i]
		m["--"+f.name] = f
		if f.arity == boolOpt {
			m["--no-"+f.name] = f
		}
		for _, a := range f.aliases {
			m["-"+a] = f
		}
	}
	return m
}()

// spellings lists every long spelling, for prefix matching and suggestions.
func spellings() []string {
	var out []string
	for k := range lookup {
		if strings.HasPrefix(k, "--") {
			out = append(out, k)
		}
	}
	return out
}
