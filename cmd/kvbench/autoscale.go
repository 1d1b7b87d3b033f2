package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/sim/fleet"
)

// autoscaleOutput is `kvbench autoscale --json`.
type autoscaleOutput struct {
	Ramp       fleet.Ramp       `json:"ramp"`
	Provision  float64          `json:"provision_s"`
	Sync       float64          `json:"sync_s"`
	MaxReplica int              `json:"max_replicas"`
	Rows       []fleet.ScaleRow `json:"rows"`
}

// runAutoscale runs the fleet model on a load step from 2 to 8 replicas' worth under the
// operator's HPA, once per scaling signal (the routers' backlog at each target, the engines'
// queue, and the operator's default pair), and prints time to scale, TTFT while scaling and
// the replica-seconds used, side by side (docs/autoscaling.md).
func runAutoscale(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("autoscale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	provision := fs.Duration("provision", 90*time.Second, "from a scale-up decision to the new replica taking requests (pod start, weights loaded)")
	targets := fs.String("backlog-targets", "0.5,1,2,4,8", "comma-separated targetBacklogPerReplica values to compare (seconds)")
	queue := fs.Float64("queue-target", 4, "targetQueuePerReplica (vllm:num_requests_waiting per replica), the operator's fallback")
	seed := fs.Int64("seed", 1, "arrival seed")
	down := fs.Bool("scale-down", false, "let the HPA scale down (its default behavior: to the highest recommendation of the last 5 minutes, at once); off measures the scale-up alone")
	workload := fs.String("workload", "chat", "request shape: chat (2,048-token prompts, decode-bound) or long (16,384-token prompts, prefill-bound)")
	rise := fs.Duration("rise", 0, "raise the load linearly over this long instead of in one step")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var bts []float64
	for _, f := range strings.Split(*targets, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return usageError{fmt.Errorf("--backlog-targets: %q is not a positive number of seconds", f)}
		}
		bts = append(bts, v)
	}
	if *provision < 0 || *queue <= 0 {
		return usageError{fmt.Errorf("--provision must be >= 0 and --queue-target > 0")}
	}
	w, ok := fleet.RampWorkloads[*workload]
	if !ok {
		return usageError{fmt.Errorf("--workload %q: want chat or long", *workload)}
	}
	ramp := fleet.Ramp{PerReplicaRate: w.PerReplicaRate, PromptBlocks: w.PromptBlocks, From: 2, To: 8, BeforeS: 120, AfterS: 600, RiseS: rise.Seconds(), Groups: 32, Seed: *seed}
	const maxReplicas = 16
	tr := fleet.RampTrace(ramp)
	out := autoscaleOutput{Ramp: ramp, Provision: provision.Seconds(), Sync: 15, MaxReplica: maxReplicas}
	type run struct {
		name           string
		backlog, queue float64
	}
	var runs []run
	for _, t := range bts {
		runs = append(runs, run{fmt.Sprintf("backlog %gs", t), t, 0})
	}
	runs = append(runs, run{fmt.Sprintf("queue %g", *queue), 0, *queue})
	for _, t := range bts {
		runs = append(runs, run{fmt.Sprintf("backlog %gs + queue %g", t, *queue), t, *queue})
	}
	for _, r := range runs {
		cfg := fleet.Config{Replicas: maxReplicas, CapacityBlocks: maxReplicas * fleet.DefaultConfig.CapacityBlocks / fleet.DefaultConfig.Replicas,
			Autoscale: &fleet.Autoscale{BacklogTarget: r.backlog, QueueTarget: r.queue, MinReplicas: ramp.From,
				SyncSeconds: out.Sync, ProvisionSeconds: out.Provision, ScaleDown: *down}}
		res, err := fleet.Run(tr, cfg, "kv")
		if err != nil {
			return err
		}
		out.Rows = append(out.Rows, fleet.ScaleFigures(r.name, ramp, res))
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	shape := "in one step"
	if ramp.RiseS > 0 {
		shape = fmt.Sprintf("linearly over %gs", ramp.RiseS)
	}
	downs := "no scale-down"
	if *down {
		downs = "the HPA's default scale-down"
	}
	fmt.Fprintf(stdout, "fleet model, kv policy, %s workload (%d-token prompts): load from %d to %d replicas' worth (%g req/s each) %s at %gs, %d requests over %gs; HPA sync %gs, provisioning %gs, %s, max %d replicas; TTFT of the requests from the rise to %ds after it; times from the rise\n\n",
		*workload, ramp.PromptBlocks*fleet.TraceBlockTokens, ramp.From, ramp.To, ramp.PerReplicaRate, shape, ramp.BeforeS, len(tr.Requests), ramp.BeforeS+ramp.AfterS, out.Sync, out.Provision, downs, maxReplicas, fleet.ScalingWindowS)
	tw := tabwriter.NewWriter(stdout, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| signal\t first scale-up (s)\t ready >= "+strconv.Itoa(ramp.To)+" (s)\t peak replicas\t TTFT p50 (s)\t TTFT p90 (s)\t replica-seconds\t")
	fmt.Fprintln(tw, "|---\t---\t---\t---\t---\t---\t---\t")
	sec := func(v float64) string {
		if v < 0 {
			return "never"
		}
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	for _, r := range out.Rows {
		fmt.Fprintf(tw, "| %s\t %s\t %s\t %d\t %.2f\t %.2f\t %.0f\t\n", r.Signal, sec(r.FirstUpS), sec(r.ReadyS), r.Peak, r.TTFTP50, r.TTFTP90, r.ReplicaSeconds)
	}
	return tw.Flush()
}
