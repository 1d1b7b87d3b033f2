package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/sim/simproc"
)

// proc is a child process whose output goes to a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

func startProc(name, bin string, args []string, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, so a Ctrl-C to kvbench is not delivered twice and stop() ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: f, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop sends SIGTERM, and SIGKILL if the process is still there after two seconds.
func (p *proc) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(2 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.log.Close()
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// sim is one running vllm-sim process, its output in a log file.
type sim struct {
	*simproc.Sim
	log *os.File
}

// startSim runs vllm-sim on ports the kernel picks (simproc.Start) with its output in logPath.
func startSim(ctx context.Context, bin, name string, args []string, logPath string) (*sim, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	s, err := simproc.Start(ctx, bin, args, simproc.Options{Name: name, Log: f, StartTimeout: 10 * time.Second})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w\n(log: %s)", err, logPath)
	}
	return &sim{Sim: s, log: f}, nil
}

// stop sends SIGTERM, and SIGKILL if the process is still there after two seconds.
func (s *sim) stop() {
	s.Stop()
	s.log.Close()
}

// EngineLine is the engines-file / --engine entry of a sim (the syntax in docs/router.md).
func (s *sim) EngineLine(name string, warmupUntil time.Time) string {
	var b strings.Builder
	b.WriteString(name + "=" + s.URL)
	if len(s.Events) > 0 {
		b.WriteString(";events=" + strings.Join(s.Events, ","))
	}
	if len(s.Replay) > 0 {
		b.WriteString(";replay=" + strings.Join(s.Replay, ","))
	}
	if !warmupUntil.IsZero() {
		b.WriteString(";warmup-until=" + warmupUntil.UTC().Format(time.RFC3339Nano))
	}
	return b.String()
}

// freePort asks the kernel for a free loopback port. It is released before the child binds it;
// the window is tiny and a clash shows as a start-up error, not a wrong result.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls url until it answers 200, the process exits, or the timeout passes.
func waitHTTP(ctx context.Context, p *proc, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited while waiting for %s: %v", p.name, url, p.err)
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("status " + strconv.Itoa(resp.StatusCode))
			}
			return fmt.Errorf("%s not ready after %s: %v", url, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writeFileAtomic writes through a temporary name and a rename, so kvrouter's re-read of the
// engines file never sees half a file.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
