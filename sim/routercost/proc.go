package routercost

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// routerProc is one running kvrouter.
type routerProc struct {
	cmd     *exec.Cmd
	logPath string
	api     string // host:port
	extProc string // host:port of the endpoint picker, with --ext-proc-listen
	done    chan struct{}
}

// startRouter runs r with --listen and --admin-listen on ports the kernel picks, JSON logs into
// logPath, then args, and returns once it logged the addresses it bound.
func startRouter(ctx context.Context, r Router, args []string, logPath string) (*routerProc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	all := slices.Concat(r.Args, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--log-format", "json", "--log-level", "info"}, args)
	cmd := exec.Command(r.Bin, all...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		f.Close()
		return nil, fmt.Errorf("start %s: %w", r.Bin, err)
	}
	p := &routerProc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	found := make(chan [2]string, 1)
	go func() {
		defer pr.Close()
		defer f.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			_, _ = f.Write(append(sc.Bytes(), '\n'))
			var rec struct {
				Msg     string `json:"msg"`
				API     string `json:"api"`
				ExtProc string `json:"ext_proc"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "kvrouter listening" && rec.API != "" {
				select {
				case found <- [2]string{rec.API, rec.ExtProc}:
				default:
				}
			}
		}
		_, _ = io.Copy(f, pr)
	}()
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	select {
	case a := <-found:
		p.api, p.extProc = a[0], a[1]
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("kvrouter exited before listening; its log:\n%s", p.tail())
	case <-timer.C:
		p.stop()
		return nil, fmt.Errorf("kvrouter logged no listening line in 20s; its log:\n%s", p.tail())
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
}

func (p *routerProc) pid() int { return p.cmd.Process.Pid }

func (p *routerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitReady polls /readyz until it answers 200.
func (p *routerProc) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for {
		resp, err := c.Get("http://" + p.api + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if p.exited() {
			return fmt.Errorf("kvrouter exited before it was ready; its log:\n%s", p.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kvrouter not ready after %v: %v", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM, then SIGKILL after two seconds.
func (p *routerProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(2 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail is the end of the router's log, for an error message.
func (p *routerProc) tail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	return string(b[max(0, len(b)-4096):])
}

// cpuTime is the CPU time (user and system, every thread) process pid has used: its process
// CPU clock, in nanoseconds, where /proc's ticks are 10 ms.
func cpuTime(pid int) (time.Duration, error) {
	// clock_getcpuclockid(3) for another process: (^pid << 3) | CPUCLOCK_SCHED.
	clk := int32(^pid<<3) | 2
	var ts unix.Timespec
	if err := unix.ClockGettime(clk, &ts); err != nil {
		return 0, fmt.Errorf("CPU clock of process %d: %w", pid, err)
	}
	if ts.Sec == 0 && ts.Nsec == 0 {
		return 0, errors.New("CPU clock of process " + fmt.Sprint(pid) + " reads zero")
	}
	return time.Duration(ts.Sec)*time.Second + time.Duration(ts.Nsec), nil
}
