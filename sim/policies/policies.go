// Package policies holds kvbench's benchmark policies: `random`, `kv-ttft` (an objective in
// seconds measured beside `kv`) and the emulations of the peers' documented policies
// (`prefix-char`, `sglang-cache-aware`, `llmd-default`, `dynamo-kv`). They implement
// score.Policy like the production ones and are offered only by the benchmark tools, which add
// them to their own score.Registry (Registry): the fleet model (kvbench cache) and the router
// kvbench serves live (kvbench replay). kvrouter cannot offer them: nothing under router/ imports
// this package.
package policies

import "github.com/kvroute/kvroute/router/score"

// Benchmark lists the benchmark policies in the order kvbench lists them after the production
// ones.
var Benchmark = []string{"kv-ttft", "random", "prefix-char", "sglang-cache-aware", "llmd-default", "dynamo-kv"}

var factories = map[string]score.Factory{
	"kv-ttft":            func(o score.Options) score.Policy { return newTTFT(o) },
	"random":             func(o score.Options) score.Policy { return newRandom(o) },
	"prefix-char":        func(o score.Options) score.Policy { return newPrefixChar(o) },
	"sglang-cache-aware": func(o score.Options) score.Policy { return newSGLang(o) },
	"llmd-default":       func(o score.Options) score.Policy { return newLLMD(o) },
	"dynamo-kv":          func(o score.Options) score.Policy { return newDynamo(o) },
}

// Register adds the benchmark policies to r.
func Register(r *score.Registry) error {
	for _, n := range Benchmark {
		if err := r.Register(n, factories[n]); err != nil {
			return err
		}
	}
	return nil
}

// Registry returns the production policies and the benchmark ones, production first.
func Registry() *score.Registry {
	r := score.Production()
	if err := Register(r); err != nil {
		panic(err) // the names are fixed and distinct from the production ones (policies_test.go)
	}
	return r
}

// IsBenchmark reports whether name is a benchmark policy (not one kvrouter offers).
func IsBenchmark(name string) bool {
	_, ok := factories[name]
	return ok
}
