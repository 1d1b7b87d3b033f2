package discovery

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

// DefaultFilePoll is how often an engines file is re-read when NewFile is given no period.
const DefaultFilePoll = time.Second

// FileOption configures NewFile.
type FileOption func(*fileSource)

// WithErrorHandler is called (from Run's goroutine) each time a changed file cannot be read
// or parsed; the last good set stays in force. Without it the error is logged.
func WithErrorHandler(f func(error)) FileOption {
	return func(s *fileSource) { s.onError = f }
}

// WithLogger sets the logger for reload messages (slog.Default() otherwise).
func WithLogger(l *slog.Logger) FileOption {
	return func(s *fileSource) { s.log = l }
}

type fileSource struct {
	path    string
	poll    time.Duration
	onError func(error)
	log     *slog.Logger
}

// NewFile is the --engines-file source: one --engine entry a line, '#' starts a comment,
// blank lines are ignored. Run reads the file at start (an unreadable or invalid file is
// Run's error) and re-reads it every poll. A changed file that fails to parse, or lists no
// engine, keeps the last good set and is reported (WithErrorHandler, or a log line) once
// per distinct content, never turning into an empty set.
//
// The file is polled and its content hashed rather than watched with fsnotify: a poll sees
// every way a file is replaced (editors' rename-over, Kubernetes ConfigMap symlink swaps,
// network file systems) and cannot miss a change within one mtime tick; reading a few
// kilobytes once a second costs nothing. Writers should still replace the file atomically
// (write a temporary file and rename it): a half-written file that parses is applied until
// the next poll.
func NewFile(path string, poll time.Duration, opts ...FileOption) Source {
	if poll <= 0 {
		poll = DefaultFilePoll
	}
	s := &fileSource{path: path, poll: poll, log: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	return s
}

func (s *fileSource) Run(ctx context.Context, update func([]Engine)) error {
	data, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("engines file: %w", err)
	}
	current, err := s.parse(data)
	if err != nil {
		return err
	}
	update(cloneSnapshot(current))
	seen := sha256.Sum256(data) // the content last looked at, good or bad
	var lastReadErr string

	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		data, err := os.ReadFile(s.path)
		if err != nil {
			// Report a missing or unreadable file once, not every poll.
			if err.Error() != lastReadErr {
				lastReadErr = err.Error()
				s.report(fmt.Errorf("engines file: %w; keeping the last %d engines", err, len(current)))
			}
			continue
		}
		lastReadErr = ""
		sum := sha256.Sum256(data)
		if sum == seen {
			continue
		}
		seen = sum
		next, err := s.parse(data)
		if err != nil {
			s.report(fmt.Errorf("%w; keeping the last %d engines", err, len(current)))
			continue
		}
		if equalSnapshots(next, current) {
			continue // only comments or spacing changed
		}
		s.log.Info("engines file reloaded", "path", s.path, "engines", len(next))
		current = next
		update(cloneSnapshot(current))
	}
}

func (s *fileSource) parse(data []byte) ([]Engine, error) {
	es, err := ParseEngineList(data)
	if err != nil {
		return nil, fmt.Errorf("engines file %s: %w", s.path, err)
	}
	if len(es) == 0 {
		return nil, fmt.Errorf("engines file %s lists no engine", s.path)
	}
	return es, nil
}

func (s *fileSource) report(err error) {
	if s.onError != nil {
		s.onError(err)
		return
	}
	s.log.Error("engines file not applied", "path", s.path, "err", err)
}

// ParseEngineList parses the engines-file format: one ParseEngineFlag entry a line; '#'
// at the start of a line or after a space starts a comment. It reports every bad line
// (line numbers from 1) and refuses duplicate names. The result is sorted by name.
func ParseEngineList(data []byte) ([]Engine, error) {
	var out []Engine
	var errs []error
	first := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := stripComment(sc.Text())
		if line == "" {
			continue
		}
		e, err := ParseEngineFlag(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		if prev, dup := first[e.Name]; dup {
			errs = append(errs, fmt.Errorf("line %d: engine %q is already listed on line %d", n, e.Name, prev))
			continue
		}
		first[e.Name] = n
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sortEngines(out)
	return out, nil
}

func stripComment(line string) string {
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "#") {
		return ""
	}
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	if i := strings.Index(line, "\t#"); i >= 0 {
		line = line[:i]
	}
	return strings.TrimSpace(line)
}
