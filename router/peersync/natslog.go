package peersync

import (
	"fmt"
	"log/slog"
)

// natsLog is the embedded NATS server's logger. The server's notices, warnings, errors and
// debug lines are dropped, as before (route dial errors repeat every retry during a partition;
// the peers' own metrics and logs tell that story once). A fatal error is logged and kept, so
// that a server that cannot start (its cluster port already taken) says why at once instead of
// timing out.
type natsLog struct {
	log   *slog.Logger
	fatal chan string // the first fatal error; buffered 1
}

func newNATSLog(log *slog.Logger) *natsLog { return &natsLog{log: log, fatal: make(chan string, 1)} }

func (l *natsLog) Noticef(string, ...any) {}
func (l *natsLog) Warnf(string, ...any)   {}
func (l *natsLog) Errorf(string, ...any)  {}
func (l *natsLog) Debugf(string, ...any)  {}
func (l *natsLog) Tracef(string, ...any)  {}

func (l *natsLog) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error("embedded NATS server failed", "err", msg)
	select {
	case l.fatal <- msg:
	default:
	}
}
