package cli

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/internal/testkit"
	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
	"github.com/kvroute/kvroute/sim/vllmsim"
)

// kvrouter --ext-proc-listen serves the endpoint picker beside the API: its readiness follows
// the router's, a request picked through it reaches the engine, and it stops with the router.
func TestRunServesTheEndpointPicker(t *testing.T) {
	sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, TimeScale: 20})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	if err := sim.Start(sctx); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	var logs syncBuf
	done := make(chan int)
	go func() {
		done <- Run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--engine", "e0=" + sim.URL(),
			"--no-events", "--ext-proc-listen", "127.0.0.1:0", "--log-format", "json"}, &logs,
			Options{ExtProcReady: func(a string) { addr <- a }})
	}()
	var ep string
	select {
	case ep = <-addr:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
	}
	gw, err := gatewaytest.Dial(ep)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	hc := healthpb.NewHealthClient(gw.Conn())
	testkit.WaitFor(t, 10*time.Second, "the picker's readiness SERVING", func() bool {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"vllm-sim","prompt":"hi there","max_tokens":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 200 || len(res.Endpoints) != 1 || !strings.HasSuffix(sim.URL(), res.Endpoints[0]) {
		t.Fatalf("picked %v, status %d: %s", res.Endpoints, res.Status, res.ClientBody)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, logs.String())
	}
	if !strings.Contains(logs.String(), `"ext_proc":"`+ep+`"`) {
		t.Fatalf("the listening line does not name the picker's address: %s", logs.String())
	}
}

// kvrouter --ext-proc-tls serves the picker over TLS with a self-signed certificate, as
// gateways dial the Inference Extension's picker: a gateway that skips verification is served,
// and a plaintext one is not.
func TestRunServesThePickerOverTLS(t *testing.T) {
	sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, TimeScale: 20})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	if err := sim.Start(sctx); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	var logs syncBuf
	done := make(chan int)
	go func() {
		done <- Run(ctx, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--engine", "e0=" + sim.URL(),
			"--no-events", "--ext-proc-listen", "127.0.0.1:0", "--ext-proc-tls", "--log-format", "json"}, &logs,
			Options{ExtProcReady: func(a string) { addr <- a }})
	}()
	var ep string
	select {
	case ep = <-addr:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
	}
	gw, err := gatewaytest.Dial(ep, gatewaytest.WithTLS(&tls.Config{InsecureSkipVerify: true})) //nolint:gosec // a gateway's view of a self-signed picker
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	hc := healthpb.NewHealthClient(gw.Conn())
	testkit.WaitFor(t, 10*time.Second, "the picker's readiness SERVING over TLS", func() bool {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"vllm-sim","prompt":"hi there","max_tokens":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != 200 || len(res.Endpoints) != 1 {
		t.Fatalf("picked %v, status %d: %s", res.Endpoints, res.Status, res.ClientBody)
	}
	plain, err := gatewaytest.Dial(ep)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := healthpb.NewHealthClient(plain.Conn()).Check(pctx, &healthpb.HealthCheckRequest{Service: "readiness"}); err == nil {
		t.Fatal("a plaintext gateway was served by the TLS picker")
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, logs.String())
	}
}
