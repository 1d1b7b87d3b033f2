// Package tracing sets up kvrouter's OpenTelemetry traces. They are off unless the standard
// OTLP endpoint variable is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); then spans go out over OTLP/gRPC, configured by the
// other standard OTEL_* variables (headers, TLS, sampler, service name).
package tracing

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of kvrouter's spans.
const Name = "github.com/kvroute/kvroute/router"

// Enabled reports whether the environment asks for traces.
func Enabled(getenv func(string) string) bool {
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// FromEnv returns the tracer kvrouter's spans go to and the function that flushes and stops
// it; a nil tracer (and a no-op shutdown) when traces are off. The exporter connects lazily:
// a collector that is down costs dropped spans, never a router that does not start.
func FromEnv(ctx context.Context, getenv func(string) string) (trace.Tracer, func(context.Context) error, error) {
	if !Enabled(getenv) {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// The service name is kvrouter unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say
	// otherwise (WithFromEnv comes last, so it wins).
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "kvrouter")), resource.WithFromEnv())
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp.Tracer(Name), tp.Shutdown, nil
}
