package cli

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
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
	sim := startSim(t)
	ctx, cancel := context.WithCancel(context.Background())
	ep, logs, done := startPicker(t, ctx, sim)
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
	sim := startSim(t)
	ctx, cancel := context.WithCancel(context.Background())
	ep, logs, done := startPicker(t, ctx, sim, "--ext-proc-tls")
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

// kvrouter --listen off is an endpoint picker only: no API listener, the picker serves and the
// admin listener still has /metrics; off without the picker is refused at start.
func TestRunPickerOnly(t *testing.T) {
	sim := startSim(t)
	var bad syncBuf
	if code := Run(context.Background(), []string{"--listen", "off", "--engine", "e0=" + sim.URL(), "--no-events"}, &bad, Options{}); code != 2 ||
		!strings.Contains(bad.String(), "needs extProc.listen") {
		t.Fatalf("--listen off without --ext-proc-listen: exit %d: %s", code, bad.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [3]string, 1)
	var api, admin string
	var logs syncBuf
	done := make(chan int)
	go func() {
		done <- Run(ctx, []string{"--listen", "off", "--admin-listen", "127.0.0.1:0", "--engine", "e0=" + sim.URL(),
			"--no-events", "--ext-proc-listen", "127.0.0.1:0", "--log-format", "json"}, &logs,
			Options{Ready: func(a, m string) { api, admin = a, m }, ExtProcReady: func(a string) { addrs <- [3]string{api, admin, a} }})
	}()
	var got [3]string
	select {
	case got = <-addrs:
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
	}
	if got[0] != "off" {
		t.Fatalf("API address %q, want off", got[0])
	}
	gw, err := gatewaytest.Dial(got[2])
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	testkit.WaitFor(t, 10*time.Second, "a pick through the picker-only router", func() bool {
		res, err := gw.Do(ctx, gatewaytest.Request{Path: "/v1/completions", Body: []byte(`{"model":"vllm-sim","prompt":"hi there","max_tokens":2}`)})
		return err == nil && res.Status == 200 && len(res.Endpoints) == 1
	})
	resp, err := http.Get("http://" + got[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "kvroute_router_requests_total") {
		t.Fatalf("admin /metrics: %d\n%.400s", resp.StatusCode, b)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, logs.String())
	}
	if !strings.Contains(logs.String(), `"api":"off"`) {
		t.Fatalf("the listening line does not say the API is off: %s", logs.String())
	}
}

// startSim starts a vllm-sim without event streams, closed when the test ends.
func startSim(t *testing.T) *vllmsim.Sim {
	t.Helper()
	sim, err := vllmsim.New(vllmsim.Config{KVEventsPort: -1, KVReplayPort: -1, TimeScale: 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// startPicker runs kvrouter in front of sim with the endpoint picker on (and extra flags) until
// ctx ends: the picker's address, the router's log, and its exit code once it stops.
func startPicker(t *testing.T, ctx context.Context, sim *vllmsim.Sim, extra ...string) (string, *syncBuf, <-chan int) {
	t.Helper()
	addr := make(chan string, 1)
	logs := &syncBuf{}
	done := make(chan int, 1)
	args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--engine", "e0=" + sim.URL(),
		"--no-events", "--ext-proc-listen", "127.0.0.1:0", "--log-format", "json"}, extra...)
	go func() { done <- Run(ctx, args, logs, Options{ExtProcReady: func(a string) { addr <- a }}) }()
	select {
	case ep := <-addr:
		return ep, logs, done
	case code := <-done:
		t.Fatalf("exited %d: %s", code, logs.String())
		return "", nil, nil
	}
}
