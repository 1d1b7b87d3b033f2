package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

// kvbench autoscale prints one row per signal: each backlog target, the queue, and each pair.
func TestAutoscaleRows(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"autoscale", "--backlog-targets", "1", "--rise", "300s", "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var o autoscaleOutput
	if err := json.Unmarshal(out.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Rows) != 3 || o.Rows[0].Signal != "backlog 1s" || o.Rows[1].Signal != "queue 4" || o.Rows[2].Signal != "backlog 1s + queue 4" {
		t.Fatalf("rows = %+v", o.Rows)
	}
	for _, r := range o.Rows {
		if r.ReadyS < 0 || r.ReplicaSeconds <= 0 {
			t.Errorf("%s did not scale: %+v", r.Signal, r)
		}
	}
	if code := run([]string{"autoscale", "--backlog-targets", "0"}, &out, &errb); code != 2 {
		t.Errorf("--backlog-targets 0: exit %d, want 2", code)
	}
}
