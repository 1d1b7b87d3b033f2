package replay

import (
	"bufio"
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

// proc is a child process whose output goes to a log file, line by line.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and its output is in the log
	err     error
}

// startProc runs bin with its stdout and stderr copied line by line into logPath; onLine, when
// set, sees every line (from the copying goroutine, so it must not block).
func startProc(name, bin string, args []string, logPath string, onLine func(string)) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = pw, pw
	// Its own process group, so a Ctrl-C to kvbench is not delivered twice and stop() ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			_, _ = f.Write(append(sc.Bytes(), '\n'))
			if onLine != nil {
				onLine(sc.Text())
			}
		}
		_, _ = io.Copy(f, pr) // past a line over 1 MiB: keep the rest, unsplit, and the child unblocked
	}()
	go func() {
		p.err = cmd.Wait()
		// The child's end of the pipe closed with it; wait briefly for the last lines, unless a
		// grandchild still holds the pipe open.
		select {
		case <-drained:
		case <-time.After(time.Second):
		}
		f.Close()
		close(p.done)
	}()
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
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logTail is the end of the process's log, for an error message.
func (p *proc) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	const max = 4 << 10
	if len(b) > max {
		b = append([]byte("[...]\n"), b[len(b)-max:]...)
	}
	return string(b)
}

// sim is one running vllm-sim process, its output in a log file.
type sim struct {
	*simproc.Sim
	log *os.File
	// role is its pool in a disaggregated run ("prefill", "decode"; "" aggregated): the
	// engines file's role key.
	role string
}

// startSim runs vllm-sim on ports the kernel picks (simproc.Start) with its output in logPath;
// env is added to its environment.
func startSim(ctx context.Context, bin, name string, args []string, logPath string, env ...string) (*sim, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	s, err := simproc.Start(ctx, bin, args, simproc.Options{Name: name, Log: f, Env: env, StartTimeout: 10 * time.Second})
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
	if s.role != "" {
		b.WriteString(";role=" + s.role)
	}
	return b.String()
}

// waitHTTP polls url until it answers 200, the process exits, or the timeout passes.
func waitHTTP(ctx context.Context, p *proc, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // drained so the connection is reused; the status is the answer
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

// freePort is a loopback TCP port free now (the kernel's pick), for a process that must be
// told its port (a simulated engine's NIXL side channel).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
