package simproc

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Addrs
		ok   bool
	}{
		{`vllm-sim: serving vllm-sim on http://127.0.0.1:40123 (2 ranks, topic "kv@127.0.0.1:40123@vllm-sim", events [tcp://127.0.0.1:40125 tcp://127.0.0.1:40127], replay [tcp://127.0.0.1:40129 tcp://127.0.0.1:40131])`,
			Addrs{URL: "http://127.0.0.1:40123", Events: []string{"tcp://127.0.0.1:40125", "tcp://127.0.0.1:40127"},
				Replay: []string{"tcp://127.0.0.1:40129", "tcp://127.0.0.1:40131"}}, true},
		// Events and replay off; vLLM's empty topic.
		{`vllm-sim: serving m on http://127.0.0.1:8000 (1 ranks, topic "", events [], replay [])`,
			Addrs{URL: "http://127.0.0.1:8000"}, true},
		// A topic with spaces and brackets does not confuse the lists.
		{`vllm-sim: serving m on http://[::1]:8000 (1 ranks, topic "a [b] c", events [tcp://[::1]:9000], replay [])`,
			Addrs{URL: "http://[::1]:8000", Events: []string{"tcp://[::1]:9000"}}, true},
		{`time=... level=WARN msg="vllm-sim: PUB send" rank=0 err="..."`, Addrs{}, false},
		{`vllm-sim: listen: address already in use`, Addrs{}, false},
		{``, Addrs{}, false},
	} {
		got, ok := ParseLine(tc.line)
		if ok != tc.ok || got.URL != tc.want.URL || !slices.Equal(got.Events, tc.want.Events) || !slices.Equal(got.Replay, tc.want.Replay) {
			t.Errorf("ParseLine(%q) = %+v, %v; want %+v, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

// script writes an executable shell script; it ignores the free-port flags Start passes.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake-sim")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestStartReadsLineThenKill(t *testing.T) {
	bin := script(t, `echo "args: $*"
echo "env: $SIMPROC_TEST" >&2
echo 'vllm-sim: serving m on http://127.0.0.1:1 (1 ranks, topic "", events [tcp://127.0.0.1:2], replay [])'
exec sleep 60`)
	var log testkit.LockedBuffer
	s, err := Start(context.Background(), bin, []string{"--model", "m"}, Options{Env: []string{"SIMPROC_TEST=on"}, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if s.URL != "http://127.0.0.1:1" || len(s.Events) != 1 || len(s.Replay) != 0 {
		t.Fatalf("addrs %+v", s.Addrs)
	}
	s.Kill()
	select {
	case <-s.Exited():
	default:
		t.Fatal("Kill returned before the process exited")
	}
	var ee *exec.ExitError
	if !errors.As(s.Err(), &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("exit %v, want killed by SIGKILL", s.Err())
	}
	for _, want := range []string{"args: --port 0 --kv-events-port -1 --kv-replay-port -1 --model m\n", "env: on\n", "serving m on"} {
		if !strings.Contains(s.Output(), want) || !strings.Contains(log.String(), want) {
			t.Errorf("output %q / log %q lack %q", s.Output(), log.String(), want)
		}
	}
}

func TestStartFailsWhenNoLine(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		bin := script(t, "echo warming up\nexec sleep 60")
		_, err := Start(context.Background(), bin, nil, Options{Name: "e0", StartTimeout: 200 * time.Millisecond})
		if err == nil || !strings.Contains(err.Error(), "e0 printed no start-up line within 200ms") || !strings.Contains(err.Error(), "warming up") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("context", func(t *testing.T) {
		bin := script(t, "echo warming up\nexec sleep 60")
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := Start(ctx, bin, nil, Options{})
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "warming up") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("exit", func(t *testing.T) {
		bin := script(t, "echo 'cannot bind' >&2\nexit 3")
		_, err := Start(context.Background(), bin, nil, Options{StartTimeout: time.Minute})
		if err == nil || !strings.Contains(err.Error(), "vllm-sim exited before serving (exit status 3)") || !strings.Contains(err.Error(), "cannot bind") {
			t.Fatalf("err %v", err)
		}
	})
}

// Stop sends SIGTERM and falls back to SIGKILL when the process ignores it.
func TestStopEscalates(t *testing.T) {
	bin := script(t, `trap '' TERM
echo 'vllm-sim: serving m on http://127.0.0.1:1 (1 ranks, topic "", events [], replay [])'
exec sleep 60`)
	s, err := Start(context.Background(), bin, nil, Options{StopGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	var ee *exec.ExitError
	if !errors.As(s.Err(), &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("exit %v, want killed by SIGKILL after ignoring SIGTERM", s.Err())
	}
	s.Stop() // again: a no-op on an exited process
}

func TestOutputKeepsTheTail(t *testing.T) {
	s := &Sim{}
	line := []byte(strings.Repeat("x", 1023) + "\n")
	for range 3 * tailMax / len(line) {
		s.keep(line)
	}
	s.keep([]byte("last\n"))
	out := s.Output()
	if len(out) > tailMax+100 || !strings.HasPrefix(out, "[earlier output dropped]\n") || !strings.HasSuffix(out, "x\nlast\n") {
		t.Fatalf("output of %d bytes, starts %q, ends %q", len(out), out[:40], out[len(out)-10:])
	}
}

// vllmSim builds cmd/vllm-sim once for the package's tests.
func vllmSim(t *testing.T) string { return testkit.Build(t, "./cmd/vllm-sim") }

func TestMain(m *testing.M) { testkit.Main(m) }

// A real vllm-sim with two DP ranks: the addresses it reports answer (HTTP /health, and a TCP
// connection to every event and replay socket), and SIGTERM ends it cleanly.
func TestStartRealSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs vllm-sim")
	}
	s, err := Start(context.Background(), vllmSim(t), []string{"--data-parallel-size", "2"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if len(s.Events) != 2 || len(s.Replay) != 2 {
		t.Fatalf("events %v replay %v; want two of each", s.Events, s.Replay)
	}
	resp, err := http.Get(s.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health: %d", resp.StatusCode)
	}
	for _, ep := range append(s.Events, s.Replay...) {
		c, err := net.Dial("tcp", strings.TrimPrefix(ep, "tcp://"))
		if err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
		c.Close()
	}
	s.Stop()
	if s.Err() != nil {
		t.Fatalf("vllm-sim after SIGTERM: %v\n%s", s.Err(), s.Output())
	}
}

// A real vllm-sim that cannot start reports its own words at once, not after the start timeout.
func TestStartRealSimBadFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs vllm-sim")
	}
	_, err := Start(context.Background(), vllmSim(t), []string{"--no-such-flag"}, Options{StartTimeout: 10 * time.Minute})
	if err == nil || !strings.Contains(err.Error(), "exited before serving") ||
		!strings.Contains(err.Error(), "flag provided but not defined: -no-such-flag") {
		t.Fatalf("err %v", err)
	}
}
