package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

// kvrouterBin builds cmd/kvrouter once per test binary, or returns $KVROUTER_BIN when set (to
// run the suite against another build, say the previous release's).
func kvrouterBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("KVROUTER_BIN"); bin != "" {
		return bin
	}
	return testkit.Build(t, "./cmd/kvrouter")
}

func TestMain(m *testing.M) { testkit.Main(m) }

// router is one running kvrouter process.
type router struct {
	t     *testing.T
	cmd   *exec.Cmd
	admin string // host:port of /metrics and /debug
	api   string
	// cluster is the embedded NATS server's route address (with peers configured).
	cluster string
	done    chan struct{}
	err     error
	log     testkit.LockedBuffer
}

// startRouter runs kvrouter with args on free loopback ports and waits until it listens.
func startRouter(t *testing.T, args ...string) *router {
	t.Helper()
	args = append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}, args...)
	cmd := exec.Command(kvrouterBin(t), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &router{t: t, cmd: cmd, done: make(chan struct{})}
	addrs := make(chan [3]string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = r.log.Write([]byte(line + "\n"))
			var rec struct {
				Msg, API, Admin string
				Cluster         string `json:"peer_cluster"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "kvrouter listening" {
				addrs <- [3]string{rec.API, rec.Admin, rec.Cluster}
			}
		}
	}()
	// Wait closes the pipe: it must come after the last read (os/exec), or a dying router's
	// last lines (its reason) are lost.
	go func() { <-drained; r.err = cmd.Wait(); close(r.done) }()
	t.Cleanup(r.kill)
	select {
	case a := <-addrs:
		r.api, r.admin, r.cluster = a[0], a[1], a[2]
	case <-r.done:
		t.Fatalf("kvrouter exited before listening (%v):\n%s", r.err, r.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("kvrouter did not listen within 30 s:\n%s", r.logs())
	}
	return r
}

func (r *router) logs() string { return r.log.String() }

// alive fails the test if the process has exited.
func (r *router) alive() {
	r.t.Helper()
	select {
	case <-r.done:
		r.t.Fatalf("kvrouter exited (%v):\n%s", r.err, r.logs())
	default:
	}
}

// stop sends SIGTERM and wants a clean exit within 15 s.
func (r *router) stop() {
	r.t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
		if r.err != nil {
			r.t.Fatalf("kvrouter exited with %v:\n%s", r.err, r.logs())
		}
	case <-time.After(15 * time.Second):
		r.kill()
		r.t.Fatal("kvrouter did not stop within 15 s of SIGTERM")
	}
}

func (r *router) kill() {
	select {
	case <-r.done:
	default:
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
}

// metric returns the value of the series name{labels...} (labels as `k="v"` pairs, all of which
// must appear), or false when /metrics has no such series.
func (r *router) metric(name string, labels ...string) (float64, bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
	return testkit.Metric(string(b), name, labels...)
}

// waitMetric polls until cond holds for the series' value, or fails after timeout.
func (r *router) waitMetric(timeout time.Duration, what string, cond func(float64) bool, name string, labels ...string) float64 {
	r.t.Helper()
	var v float64
	var ok bool
	if !testkit.Until(timeout, func() bool {
		r.alive()
		v, ok = r.metric(name, labels...)
		return ok && cond(v)
	}) {
		r.t.Fatalf("%s: %s%v = %v (present %v) after %v\n%s", what, name, labels, v, ok, timeout, r.logs())
	}
	return v
}
