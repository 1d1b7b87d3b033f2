// Package discovery says which engines the router routes to: a static list (--engine), a
// file re-read when it changes (--engines-file), or the engine pods of one model found through
// the Kubernetes API (--namespace, --selector). Every source hands the router a complete,
// name-sorted snapshot each time the set changes, so consumers diff snapshots instead of
// following add/remove events.
package discovery

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/router/engine"
)

// Engine is one routable engine (a pod, or a static entry) with one event stream per DP rank.
type Engine struct {
	// Name is the pod name or the static NAME; unique within a snapshot.
	Name string
	// URL is http://host:port of the OpenAI API, without a trailing slash.
	URL string
	// Events are the KV-event PUB endpoints per DP rank, rank order: tcp://host:port
	// ("" = no events for that rank).
	Events []string
	// Replay are the replay (ROUTER) endpoints per DP rank, rank order ("" = no replay); nil,
	// the same length as Events, or — for a router in bound mode, where events arrive on its
	// own socket — given without Events.
	Replay []string
	// Snapshot are the snapshot (ROUTER) endpoints per DP rank, rank order ("" = none for that
	// rank); nil, or the same length as the Events or Replay given. With one a stream starts
	// from the engine's whole cache state and rebuilds a gap its replay ring no longer covers.
	Snapshot []string
	// BlockSize is the engine's KV block size in tokens; 0 = unknown (learned from events).
	BlockSize int
	// Kind is the engine family ("" = the router's --engine-kind). The router runs one kind: an
	// engine of another is refused (see MixedKinds).
	Kind engine.Kind
	// WarmupUntil is when the engine's warm-up credit ends; zero = not warming.
	WarmupUntil time.Time
	// Ready engines are routed to; the others are listed so their streams and debug state
	// can be kept (a terminating pod, a pod whose readiness probe fails).
	Ready bool
	// Incarnation changes when the engine restarts (a new pod UID, a container restart); the
	// router treats a change for the same Name as a restart of every stream of it. Static
	// and file engines have none ("").
	Incarnation string
	// Topic is the KV-event topic the engine publishes, when the operator says so (the pod
	// annotation config.TopicAnnotation); "" is <prefix>@<host>@<model>.
	Topic string
	// Role is the engine's pool in a disaggregated model: config.RolePrefill or
	// config.RoleDecode; "" for an engine that computes whole requests (aggregated).
	Role string
}

// Ranks is the number of DP ranks the engine announces event, replay or snapshot endpoints for (at
// least 1).
func (e Engine) Ranks() int {
	return max(1, len(e.Events), len(e.Replay), len(e.Snapshot))
}

// Equal reports whether two engines are identical, field by field.
func (e Engine) Equal(o Engine) bool {
	return e.Name == o.Name && e.URL == o.URL && slices.Equal(e.Events, o.Events) &&
		slices.Equal(e.Replay, o.Replay) && slices.Equal(e.Snapshot, o.Snapshot) && e.BlockSize == o.BlockSize && e.Kind == o.Kind &&
		e.WarmupUntil.Equal(o.WarmupUntil) && e.Ready == o.Ready && e.Incarnation == o.Incarnation && e.Role == o.Role
}

// Source produces the full set of engines each time it changes.
type Source interface {
	// Run blocks until ctx ends, calling update with a complete, sorted snapshot on start
	// and after every change. update is never called concurrently with itself, and the
	// snapshot it gets is its own (the source keeps no reference to it).
	Run(ctx context.Context, update func([]Engine)) error
}

// sortEngines orders a snapshot by name, the order every source promises.
func sortEngines(es []Engine) {
	slices.SortFunc(es, func(a, b Engine) int { return strings.Compare(a.Name, b.Name) })
}

// equalSnapshots compares two sorted snapshots.
func equalSnapshots(a, b []Engine) bool {
	return slices.EqualFunc(a, b, Engine.Equal)
}

// cloneSnapshot deep-copies a snapshot so a consumer may keep or change what it was given.
func cloneSnapshot(es []Engine) []Engine {
	out := make([]Engine, len(es))
	for i, e := range es {
		e.Events = slices.Clone(e.Events)
		e.Replay = slices.Clone(e.Replay)
		e.Snapshot = slices.Clone(e.Snapshot)
		out[i] = e
	}
	return out
}

// MixedKinds returns an error naming the first engine whose kind is not fleet's. A fleet runs one
// engine kind: the router tokenizes each request once, through one engine's route, and keys it
// one way, so an engine of another kind (its own chat rendering, tokenize route, /metrics names
// and event layout) would be scored against keys it may not share. Refusing such a fleet, rather
// than scoring part of it wrongly, is the rule.
func MixedKinds(fleet engine.Kind, es []Engine) error {
	for _, e := range es {
		if k := e.Kind.Or(fleet); k != fleet {
			return fmt.Errorf("engine %s is kind=%s but the router runs %s engines: a fleet mixing engine kinds is refused (run one router per kind)", e.Name, k, fleet)
		}
	}
	return nil
}
