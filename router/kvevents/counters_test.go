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
