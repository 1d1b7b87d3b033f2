// Package report writes one router pod's view of the index health into its KVRoutedModel's
// status: the entry status.routerReports[pod=<this pod>], by server-side apply under the field
// manager kvrouter-<pod>. Each router owns its own entry of the list-map, so several router
// replicas never overwrite each other, and the router needs nothing but get/patch on its own
// model's status subresource. The operator aggregates the fresh entries into IndexHealthy.
package report

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// GVR is the KVRoutedModel resource.
var GVR = schema.GroupVersionResource{Group: "serving.kvroute.io", Version: "v1alpha1", Resource: "kvroutedmodels"}

// Degraded is one reason in force on one engine replica.
type Degraded struct {
	Replica string    `json:"replica"`
	Reason  string    `json:"reason"`
	Since   time.Time `json:"since"`
	Detail  string    `json:"detail,omitempty"`
}

// Options configure a Reporter.
type Options struct {
	Namespace, Model, Pod string
	// Source returns the degraded replicas now, in a stable order.
	Source func() []Degraded
	// Peers, when set, returns the other router pods this one receives load from, sorted
	// (several router replicas); a peer joining or leaving is written at once.
	Peers func() []string
	// Held, when set, returns how many requests this router holds for want of a ready replica
	// (router/admission). Starting or stopping to hold is written at once: it is the demand
	// that wakes a model at zero replicas. The count in between rides on the heartbeat.
	Held func() int
	// Backlog, when set, returns the model's backlog in seconds and whether it is measured;
	// read only when the report is written (heartbeat or change), so it costs nothing between.
	Backlog func() (float64, bool)
	// Interval between looks at Source (1s): a look reads memory only and writes nothing unless
	// a reason began or ended, so it is short to keep a new reason's way to the API server short.
	Interval time.Duration
	// Heartbeat re-confirms an unchanged report (DefaultHeartbeat); the operator ignores reports
	// older than 50 s (controllers/status.ReportTTL).
	Heartbeat time.Duration
	Now       func() time.Time
	Logger    *slog.Logger
}

// DefaultHeartbeat is how often an unchanged report is confirmed: 20 s, so that the operator
// can count a report stale after 50 s (two confirmations missed) and show a router that
// stopped within 60 s. Three status writes a minute per router pod when nothing changes; each
// is one server-side apply of the router's own entry.
const DefaultHeartbeat = 20 * time.Second

// Reporter writes the report.
type Reporter struct {
	o         Options
	client    dynamic.ResourceInterface
	last      []Degraded
	lastPeers []string
	lastHeld  int
	lastAt    time.Time
	written   bool
	failing   bool
}

// New returns a Reporter over a REST config.
func New(rc *rest.Config, o Options) (*Reporter, error) {
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Namespace == "" || o.Model == "" || o.Pod == "" {
		return nil, fmt.Errorf("report: namespace, model and pod are required")
	}
	return &Reporter{o: o, client: dc.Resource(GVR).Namespace(o.Namespace)}, nil
}

// FieldManager is the field manager of this router's entry.
func (r *Reporter) FieldManager() string { return "kvrouter-" + r.o.Pod }

// Run writes the report at once, then on every change and heartbeat, until ctx ends.
func (r *Reporter) Run(ctx context.Context) {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	for {
		_ = r.Sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sync writes the report if a reason began or ended, or its heartbeat is due. A detail alone
// (its counts move at every sample while a fault lasts) waits for the heartbeat: each write
// wakes the operator, and a lasting fault would otherwise write every sample.
func (r *Reporter) Sync(ctx context.Context) error {
	now := r.o.Now()
	cur := r.o.Source()
	var peers []string
	if r.o.Peers != nil {
		peers = r.o.Peers()
		if len(peers) > maxPeers {
			peers = peers[:maxPeers]
		}
	}
	held := 0
	if r.o.Held != nil {
		held = r.o.Held()
	}
	if r.written && sameReasons(cur, r.last) && slices.Equal(peers, r.lastPeers) && (held > 0) == (r.lastHeld > 0) &&
		now.Sub(r.lastAt) < r.o.Heartbeat {
		return nil
	}
	if err := r.write(ctx, now, cur, peers, held); err != nil {
		if !r.failing {
			r.o.Logger.Warn("router report not written to the KVRoutedModel status", "model", r.o.Model, "err", err)
		}
		r.failing = true
		return err
	}
	if r.failing {
		r.o.Logger.Info("router report written again", "model", r.o.Model)
	}
	r.failing, r.written, r.last, r.lastPeers, r.lastHeld, r.lastAt = false, true, cur, peers, held, now
	return nil
}

// sameReasons reports whether a and b hold the same reasons (replica, reason, since), whatever
// their details.
func sameReasons(a, b []Degraded) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Replica != b[i].Replica || a[i].Reason != b[i].Reason || !a[i].Since.Equal(b[i].Since) {
			return false
		}
	}
	return true
}

type degradedJSON struct {
	Replica string      `json:"replica"`
	Reason  string      `json:"reason"`
	Since   metav1.Time `json:"since"`
	Detail  string      `json:"detail,omitempty"`
}

// maxDetail and maxEntries keep the entry inside the CRD's bounds.
const (
	maxDetail  = 256
	maxEntries = 32
	maxPeers   = 16
)

// shorten cuts a detail to maxDetail bytes with "...", at a UTF-8 character boundary: an
// engine's error text may hold any character, and a cut inside one would reach the status as
// a replacement character.
func shorten(detail string) string {
	if len(detail) <= maxDetail {
		return detail
	}
	cut := maxDetail - 3
	for cut > 0 && !utf8.RuneStart(detail[cut]) {
		cut--
	}
	return detail[:cut] + "..."
}

func (r *Reporter) write(ctx context.Context, now time.Time, cur []Degraded, peers []string, held int) error {
	ds := make([]degradedJSON, 0, len(cur))
	for i, d := range cur {
		if i == maxEntries {
			break
		}
		ds = append(ds, degradedJSON{Replica: d.Replica, Reason: d.Reason, Since: metav1.NewTime(d.Since), Detail: shorten(d.Detail)})
	}
	entry := map[string]any{"pod": r.o.Pod, "observedAt": metav1.NewTime(now), "degraded": ds}
	if r.o.Peers != nil {
		entry["peers"] = append([]string{}, peers...)
	}
	if r.o.Held != nil {
		entry["held"] = min(held, math.MaxInt32)
	}
	if r.o.Backlog != nil {
		if sec, ok := r.o.Backlog(); ok && sec >= 0 && !math.IsInf(sec, 0) {
			// Milliseconds are plenty for a scaling signal, and keep the quantity short.
			entry["backlogSeconds"] = resource.NewMilliQuantity(int64(math.Round(min(sec, 1e9)*1000)), resource.DecimalSI).String()
		}
	}
	patch := map[string]any{
		"apiVersion": GVR.GroupVersion().String(),
		"kind":       "KVRoutedModel",
		"metadata":   map[string]any{"name": r.o.Model, "namespace": r.o.Namespace},
		"status":     map[string]any{"routerReports": []any{entry}},
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	force := true
	_, err = r.client.Patch(ctx, r.o.Model, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: r.FieldManager(), Force: &force}, "status")
	return err
}
