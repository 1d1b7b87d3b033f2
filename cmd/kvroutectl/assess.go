package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/kvroute/kvroute/assess"
)

// apiKeyEnv is read when --api-key-file is not given: the variable vLLM's own server reads its
// key from, so an operator who set it for the engines has it at hand.
const apiKeyEnv = "VLLM_API_KEY"

// urlList collects --engines values: repeatable and comma-separated.
type urlList []string

func (u *urlList) String() string { return strings.Join(*u, ",") }

func (u *urlList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*u = append(*u, s)
		}
	}
	return nil
}

// runAssess reads a fleet's vLLM counters (Prometheus, or the engines directly) and says whether
// its traffic deserves a KV-aware router.
func runAssess(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("assess", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prom := fs.String("prometheus", "", "Prometheus base URL; the counters come from its HTTP API (/api/v1/query)")
	var engines urlList
	fs.Var(&engines, "engines", "engine base URLs (http://HOST:PORT), repeatable or comma-separated; scraped at the start and the end of the window")
	window := fs.Duration("window", 5*time.Minute, "the span the counters' increase covers")
	model := fs.String("model", "", "served model name (model_name label); needed when more than one model is found")
	selector := fs.String("selector", "", `extra PromQL label matchers for --prometheus, e.g. 'namespace="llm"'`)
	podLabel := fs.String("pod-label", "pod", "with --prometheus, the label that names a pod (series without it use instance)")
	sampleEvery := fs.Duration("sample-every", 0, "with --engines, how often to sample the gauges in the window (0 = window/20, 250ms..5s)")
	apiKeyFile := fs.String("api-key-file", "", "with --engines, a file holding the key for a proxy that protects /metrics (default: $"+apiKeyEnv+")")
	promTokenFile := fs.String("prometheus-token-file", "", "with --prometheus, a file holding a bearer token")
	timeout := fs.Duration("timeout", 30*time.Second, "per HTTP request")
	output := fs.String("output", "table", "table, json or markdown")
	th := assess.DefaultThresholds()
	fs.Float64Var(&th.HighHitRate, "high-hit-rate", th.HighHitRate, "every replica at or above this hit rate: already-high")
	fs.Float64Var(&th.MinGain, "min-gain", th.MinGain, "below this ceiling gain (share of prompt tokens): not-worth-it")
	fs.Float64Var(&th.PreemptionWarn, "preemption-warn", th.PreemptionWarn, "warn at this many preemptions per finished request")
	fs.Float64Var(&th.KVPressureWarn, "kv-pressure-warn", th.KVPressureWarn, "warn when KV usage reaches this share")
	fs.Float64Var(&th.ImbalanceWarn, "imbalance-warn", th.ImbalanceWarn, "warn when the busiest replica's load reaches this multiple of the mean")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvroutectl assess (--prometheus URL | --engines URL [URL ...]) [--window 5m] [--model NAME] [--output table|json|markdown]")
		fmt.Fprintln(stderr, "\nReads vLLM's prefix-cache, preemption, KV-usage and queue metrics and says whether this fleet's")
		fmt.Fprintln(stderr, "traffic deserves a KV-cache-aware router: single-replica, already-high, not-worth-it or worth-routing.")
		fmt.Fprintln(stderr, "Exit 0 with a verdict, 1 when the fleet cannot be assessed, 2 for bad usage.")
		fs.PrintDefaults()
	}
	if err := parseInterspersed(fs, args, &engines); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "kvroutectl assess: "+format+"\n", a...)
		return 2
	}
	switch {
	case (*prom == "") == (len(engines) == 0):
		return usage("give exactly one of --prometheus and --engines")
	case *output != "table" && *output != "json" && *output != "markdown":
		return usage("--output must be table, json or markdown, got %q", *output)
	case *window <= 0:
		return usage("--window must be positive, got %v", *window)
	case *prom != "" && (*apiKeyFile != "" || *sampleEvery != 0):
		return usage("--api-key-file and --sample-every apply to --engines")
	case len(engines) > 0 && (*selector != "" || *promTokenFile != ""):
		return usage("--selector and --prometheus-token-file apply to --prometheus")
	}
	if err := th.Validate(); err != nil {
		return usage("%v", err)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kvroutectl assess: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var snap assess.Snapshot
	var err error
	if *prom != "" {
		token, terr := readSecret(*promTokenFile, "")
		if terr != nil {
			return fail(terr)
		}
		snap, err = assess.CollectPrometheus(ctx, assess.PromOptions{URL: *prom, Window: *window, Model: *model,
			Selector: *selector, PodLabel: *podLabel, BearerToken: token, Timeout: *timeout})
	} else {
		key, kerr := readSecret(*apiKeyFile, apiKeyEnv)
		if kerr != nil {
			return fail(kerr)
		}
		fmt.Fprintf(stderr, "kvroutectl assess: scraping %d engine(s) for %v...\n", len(engines), *window)
		snap, err = assess.CollectEngines(ctx, assess.EngineOptions{URLs: engines, Window: *window,
			SampleEvery: *sampleEvery, Model: *model, APIKey: key, Timeout: *timeout, Wait: engineWait})
	}
	if err != nil {
		return fail(err)
	}
	a, err := assess.Decide(snap, th)
	if err != nil {
		return fail(err)
	}
	switch *output {
	case "json":
		err = assess.RenderJSON(stdout, a)
	case "markdown":
		err = assess.RenderMarkdown(stdout, a)
	default:
		err = assess.RenderTable(stdout, a)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// engineWait replaces the window's sleep when set (tests only).
var engineWait func(context.Context) error

// parseInterspersed lets --engines take several URLs in a row (--engines http://a http://b) by
// treating positional arguments as more engine URLs, wherever they sit among the flags.
func parseInterspersed(fs *flag.FlagSet, args []string, engines *urlList) error {
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		args = fs.Args()
		if len(args) == 0 {
			return nil
		}
		if len(*engines) == 0 {
			fmt.Fprintf(fs.Output(), "kvroutectl assess: unexpected argument %q\n", args[0])
			return errors.New("unexpected argument")
		}
		for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			_ = engines.Set(args[0])
			args = args[1:]
		}
	}
}

// readSecret reads a key from a file (trimmed), else from the environment variable env.
func readSecret(file, env string) (string, error) {
	if file == "" {
		if env == "" {
			return "", nil
		}
		return strings.TrimSpace(os.Getenv(env)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return key, nil
}
