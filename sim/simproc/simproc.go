// Package simproc runs vllm-sim (cmd/vllm-sim) as a child process on ports the kernel picks and
// reads the addresses it bound from its start-up line. No caller guesses a port: a port that
// a test or tool picks, frees and passes on can be taken by another process before vllm-sim
// binds it. A process that exits before it serves is reported at once, with its output.
package simproc

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Addrs is what one vllm-sim bound: its HTTP base URL and, one per DP rank, the ZMQ endpoints of
// its KV-event PUB and replay ROUTER sockets (none when they are off).
type Addrs struct {
	URL    string   // http://HOST:PORT
	Events []string // tcp://HOST:PORT
	Replay []string // tcp://HOST:PORT
}

// startLine matches the line cmd/vllm-sim prints once every socket is bound, e.g.
//
//	vllm-sim: serving m on http://127.0.0.1:40123 (2 ranks, topic "kv@...", events [tcp://127.0.0.1:40125 tcp://127.0.0.1:40127], replay [])
//
// The lists may hold brackets themselves (IPv6 hosts), so they are read up to the fixed text
// around them.
var startLine = regexp.MustCompile(`serving .* on (http://\S+) \(\d+ ranks, topic ".*", events \[(.*)\], replay \[(.*)\]\)\s*$`)

// ParseLine returns the addresses in vllm-sim's start-up line, and false for any other line.
func ParseLine(line string) (Addrs, bool) {
	m := startLine.FindStringSubmatch(line)
	if m == nil {
		return Addrs{}, false
	}
	return Addrs{URL: m[1], Events: strings.Fields(m[2]), Replay: strings.Fields(m[3])}, true
}

// freePortArgs go before the caller's arguments; a flag given again later wins, so a caller
// turns the event or replay socket off with "--kv-events-port 0" or "--kv-replay-port 0".
var freePortArgs = []string{"--port", "0", "--kv-events-port", "-1", "--kv-replay-port", "-1"}

// Options tune Start; the zero value is ready to use.
type Options struct {
	Name         string        // in errors; "vllm-sim" when empty
	Env          []string      // KEY=VALUE added to the command's environment
	Log          io.Writer     // receives every line the process writes, stdout and stderr (may be nil)
	StartTimeout time.Duration // bound on the wait for the start-up line; 30 s when 0
	StopGrace    time.Duration // Stop sends SIGTERM, then SIGKILL after this; 2 s when 0
}

// tailMax bounds the output a Sim keeps for error messages and Output.
const tailMax = 256 << 10

// Sim is one running vllm-sim process.
type Sim struct {
	Addrs
	name  string
	grace time.Duration
	cmd   *exec.Cmd
	done  chan struct{} // closed once the process has exited and its output is read
	err   error         // cmd.Wait's result, set before done closes

	mu      sync.Mutex
	tail    []byte // the last output, at most tailMax bytes
	dropped bool   // earlier output was cut from tail
}

// Start runs vllm-sim from bin with --port 0 --kv-events-port -1 --kv-replay-port -1 and then
// args, and returns once the process has printed the addresses it bound (its HTTP listener
// accepts from then on). It fails with the process's output when the process exits first, when
// StartTimeout passes or when ctx ends (the process is stopped then). ctx bounds the start
// only: the process runs until Stop or Kill.
func Start(ctx context.Context, bin string, args []string, opts Options) (*Sim, error) {
	return StartCmd(ctx, exec.Command(bin, args...), opts)
}

// StartCmd is Start for a command the caller prepared (say, to run under chroot): the free-port
// flags go before its arguments. Its Stdout and Stderr must be nil; the Sim reads both.
func StartCmd(ctx context.Context, cmd *exec.Cmd, opts Options) (*Sim, error) {
	s := &Sim{name: cmp.Or(opts.Name, "vllm-sim"), grace: cmp.Or(opts.StopGrace, 2*time.Second), cmd: cmd, done: make(chan struct{})}
	if cmd.Stdout != nil || cmd.Stderr != nil {
		return nil, fmt.Errorf("%s: the command's output is read by simproc; leave Stdout and Stderr nil", s.name)
	}
	if len(cmd.Args) == 0 { // an exec.Cmd literal: Args[0] is the program's name
		cmd.Args = []string{cmd.Path}
	}
	cmd.Args = slices.Concat(cmd.Args[:1], freePortArgs, cmd.Args[1:])
	if opts.Env != nil {
		cmd.Env = append(cmd.Environ(), opts.Env...)
	}
	// Its own process group: a Ctrl-C in the caller's terminal reaches the caller only, which
	// then stops its children in order.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	// An *os.File goes to the child as is: no copying goroutine that Wait would wait for.
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("start %s: %w", s.name, err)
	}
	found := make(chan Addrs, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		defer pr.Close()
		s.read(pr, opts.Log, found)
	}()
	go func() {
		s.err = cmd.Wait()
		// The child's end of the pipe closed with it; wait briefly for the last lines, unless a
		// grandchild still holds the pipe open.
		select {
		case <-drained:
		case <-time.After(time.Second):
		}
		close(s.done)
	}()

	timer := time.NewTimer(cmp.Or(opts.StartTimeout, 30*time.Second))
	defer timer.Stop()
	select {
	case a := <-found:
		s.Addrs = a
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("%s exited before serving (%v); its output:\n%s", s.name, s.err, s.Output())
	case <-timer.C:
		s.Stop()
		return nil, fmt.Errorf("%s printed no start-up line within %v; its output:\n%s",
			s.name, cmp.Or(opts.StartTimeout, 30*time.Second), s.Output())
	case <-ctx.Done():
		s.Stop()
		return nil, fmt.Errorf("%s: starting: %w; its output:\n%s", s.name, ctx.Err(), s.Output())
	}
}

// read copies the process's output line by line into the tail and log, and sends the addresses
// of the first start-up line on found.
func (s *Sim) read(r io.Reader, log io.Writer, found chan<- Addrs) {
	emit := func(b []byte) {
		s.keep(b)
		if log != nil {
			_, _ = log.Write(b)
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		emit([]byte(line + "\n"))
		if !sent {
			if a, ok := ParseLine(line); ok {
				found <- a
				sent = true
			}
		}
	}
	if sc.Err() != nil { // a line over 1 MiB: keep the rest unsplit rather than block the child
		_, _ = io.Copy(writerFunc(func(b []byte) (int, error) { emit(b); return len(b), nil }), r)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (s *Sim) keep(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tail = append(s.tail, b...)
	if len(s.tail) > tailMax {
		// Cut to half the bound, so trimming costs O(1) a byte over time.
		s.tail = append(s.tail[:0], s.tail[len(s.tail)-tailMax/2:]...)
		s.dropped = true
	}
}

// Output is what the process has written so far, stdout and stderr interleaved (the last
// 256 KiB of it).
func (s *Sim) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropped {
		return "[earlier output dropped]\n" + string(s.tail)
	}
	return string(s.tail)
}

// Pid is the process's id (to read its CPU time from /proc).
func (s *Sim) Pid() int { return s.cmd.Process.Pid }

// Exited is closed once the process has exited (and its output is read).
func (s *Sim) Exited() <-chan struct{} { return s.done }

// Err is how the process ended (cmd.Wait's error; nil for exit status 0); valid once Exited is
// closed.
func (s *Sim) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return errors.New(s.name + " still running")
	}
}

// Stop sends SIGTERM, and SIGKILL if the process is still there after the grace period; it
// returns once the process has exited. It may be called more than once.
func (s *Sim) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(s.grace):
		s.Kill()
	}
}

// Kill sends SIGKILL (kill -9) and returns once the process has exited.
func (s *Sim) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}
