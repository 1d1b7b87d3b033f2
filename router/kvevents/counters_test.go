package kvevents

import (
	"reflect"
	"testing"
)

// Every uint64 and int64 field of Stats is in the counter table exactly once, and its row reads that field:
// each field is set to a distinct value through reflection and Counters must return it under the
// field's name. A counter added to Stats without a row fails here, so it cannot go unexported.
func TestEveryStatsCounterIsExported(t *testing.T) {
	var s Stats
	v := reflect.ValueOf(&s).Elem()
	want := map[string]uint64{}
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		val := uint64(1000 + i)
		switch {
		case f.Name == "LastSeq": // a gauge of its own (stream_last_seq)
			continue
		case f.Type.Kind() == reflect.Uint64:
			v.Field(i).SetUint(val)
		case f.Type.Kind() == reflect.Int64:
			v.Field(i).SetInt(int64(val))
		default:
			continue
		}
		want[f.Name] = val
	}
	metrics, keys := map[string]bool{}, map[string]bool{}
	for _, c := range s.Counters() {
		w, ok := want[c.Field]
		if !ok {
			t.Errorf("table row %q names no uint64 counter of Stats", c.Field)
			continue
		}
		if c.Value != w {
			t.Errorf("row %q reads %d, the field holds %d", c.Field, c.Value, w)
		}
		if metrics[c.Metric] || keys[c.Key] || c.Help == "" {
			t.Errorf("row %q: metric %q or key %q repeated, or no help", c.Field, c.Metric, c.Key)
		}
		metrics[c.Metric], keys[c.Key] = true, true
		delete(want, c.Field)
	}
	for f := range want {
		t.Errorf("Stats.%s has no row in counterTable: add one so /metrics and /debug/engines show it", f)
	}
}

// Every counter is told one way beyond its metric and debug field: traffic, a state change, a
// log line where it happens, or the router's first-drop WARN.
func TestEveryCounterIsToldOnce(t *testing.T) {
	for _, c := range CounterSpecs() {
		n := 0
		for _, set := range []map[string]bool{trafficFields, stateFields, siteLoggedFields, dropFields} {
			if set[c.Field] {
				n++
			}
		}
		if n != 1 {
			t.Errorf("counter %s is in %d of the traffic, state, site-logged and drop sets, want exactly 1", c.Field, n)
		}
	}
}

// FirstDrops names each kind of drop once per stream, with how much it grew.
func TestFirstDrops(t *testing.T) {
	logged := map[string]bool{}
	prev := Stats{Received: 10, UnknownParent: 1}
	cur := Stats{Received: 20, Applied: 5, UnknownParent: 4, SkippedMedia: 2}
	got := FirstDrops(prev, cur, logged)
	if len(got) != 2 || got[0].Key != "unknown_parents" || got[0].Value != 3 || got[1].Key != "skipped_media" || got[1].Value != 2 {
		t.Fatalf("first drops %+v", got)
	}
	next := cur
	next.UnknownParent, next.MalformedFrames = 9, 1
	if got := FirstDrops(cur, next, logged); len(got) != 1 || got[0].Key != "malformed_frames" {
		t.Fatalf("second sample %+v, want only the new kind", got)
	}
}
