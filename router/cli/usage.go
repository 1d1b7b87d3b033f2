package cli

import (
	"errors"
	"flag"
	"io"
	"os"

	"github.com/kvroute/kvroute/internal/cliusage"
)

// errVersion is what parse returns for --version: run prints the version and exits 0.
var errVersion = errors.New("version requested")

// versionOut is where --version prints (a test swaps it).
var versionOut io.Writer = os.Stdout

// flagGroups orders kvrouter's usage text by task; a test fails for a flag no group names.
var flagGroups = []cliusage.Group{
	{Title: "API", Flags: []string{"config", "listen", "admin-listen", "model", "version"}},
	{Title: "Gateway API endpoint picker", Flags: []string{"ext-proc-listen", "ext-proc-tls", "ext-proc-cert-dir", "ext-proc-conformance-hooks"}},
	{Title: "Engines", Flags: []string{"engine", "engines-file", "namespace", "selector", "engine-port", "inference-pool",
		"events-bind", "no-events", "block-size", "engine-kind", "engine-api-key-env", "engine-api-key-file", "kv-cache-report-full"}},
	{Title: "Policy", Flags: []string{"policy", "shadow-policy", "hold-max-waiting", "hold-max-wait"}},
	{Title: "Observability", Flags: []string{"log-format", "log-level", "access-log-sample", "audit",
		"capture-dir", "capture-max-bytes", "capture-files"}},
}

const usageSynopsis = `usage: kvrouter [flags]

kvroute's KV-cache-aware OpenAI-compatible router. Flags override the --config file
(docs/router.md); give one engine source: --engine, --engines-file, --namespace/--selector or
--namespace/--inference-pool. --ext-proc-listen also serves it as a Gateway API Inference
Extension endpoint picker (docs/gateways.md).`

const usageExample = `Example (one vllm-sim started with --port 8001 --kv-events-port 5557 --kv-replay-port 5558):
  kvrouter --engine 'e0=http://127.0.0.1:8001;events=tcp://127.0.0.1:5557;replay=tcp://127.0.0.1:5558' \
    --listen :8000 --admin-listen 127.0.0.1:9090 --policy kv
`

func usage(fs *flag.FlagSet, w io.Writer) func() {
	return cliusage.Func(fs, w, usageSynopsis, flagGroups, usageExample)
}
