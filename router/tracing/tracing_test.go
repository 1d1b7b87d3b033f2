package tracing

import (
	"context"
	"testing"
)

func TestOffWithoutEndpoint(t *testing.T) {
	tr, stop, err := FromEnv(context.Background(), func(string) string { return "" })
	if err != nil || tr != nil {
		t.Fatalf("no endpoint: tracer %v, err %v; want none", tr, err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestOnWithEndpoint(t *testing.T) {
	env := map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"}
	tr, stop, err := FromEnv(context.Background(), func(k string) string { return env[k] })
	if err != nil || tr == nil {
		t.Fatalf("endpoint set: tracer %v, err %v; want one", tr, err)
	}
	_, span := tr.Start(context.Background(), "probe")
	if !span.SpanContext().IsValid() {
		t.Errorf("span from the OTLP tracer has no valid context")
	}
	span.End()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing listens on the endpoint: the flush gives up at once
	_ = stop(ctx)
}
