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
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process whose output goes to a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

func startProc(name, bin string, args []string, logPath string, stderr io.Writer) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = f
	if stderr != nil {
		cmd.Stderr = stderr
	} else {
		cmd.Stderr = f
	}
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

// sim is one running vllm-sim process.
type sim struct {
	*proc
	URL    string
	Events []string
	Replay []string
}

// simLine is the line vllm-sim prints once its sockets are bound.
var simLine = regexp.MustCompile(`serving .* on (http://\S+) \(\d+ ranks, topic ".*", events \[([^\]]*)\], replay \[([^\]]*)\]\)`)

// startSim runs vllm-sim with free ports (--port 0, events and replay -1) and reads the bound
// addresses from its start-up line, so no port is guessed.
func startSim(ctx context.Context, bin, name string, args []string, logPath string) (*sim, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p, err := startProc(name, bin, args, logPath, pw)
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, err
	}
	found := make(chan []string, 1)
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(p.log, line)
			if !sent {
				if m := simLine.FindStringSubmatch(line); m != nil {
					found <- m[1:]
					sent = true
				}
			}
		}
	}()
	select {
	case m := <-found:
		return &sim{proc: p, URL: m[0], Events: strings.Fields(m[1]), Replay: strings.Fields(m[2])}, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before serving (see %s): %v", name, logPath, p.err)
	case <-time.After(10 * time.Second):
		p.stop()
		return nil, fmt.Errorf("%s did not report its addresses within 10 s (see %s)", name, logPath)
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
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
