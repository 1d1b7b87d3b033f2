package cli

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/extproc"
)

// extProcServer is the endpoint picker's gRPC listener: ext_proc and the health services.
type extProcServer struct {
	ln  net.Listener
	g   *grpc.Server
	eps *extproc.Server
}

// startExtProc binds the endpoint picker's listener and builds its server over the router's
// request pipeline (app.Router.Picker); serve starts it.
func startExtProc(x *config.ExtProc, srv *app.Router, log *slog.Logger, lim config.Limits) (*extProcServer, error) {
	creds, err := extProcCredentials(x, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", x.Listen)
	if err != nil {
		return nil, err
	}
	// The proxy's limits bound the picker alike: the body it holds, the time the body may take
	// to arrive, a whole request.
	eps := extproc.New(srv.Picker(), extproc.Options{MaxBodyBytes: int(lim.MaxBodyBytes), BodyTimeout: lim.BodyReadTimeout.Duration,
		StreamTimeout: lim.RequestTimeout.Duration, ConformanceHooks: x.ConformanceHooks, Logger: log, Registerer: srv.Metrics().Registry})
	// A gateway keeps one connection and opens a stream per request; keepalive pings find a
	// gateway that vanished, so its streams end (and their bookings are released).
	g := grpc.NewServer(creds, grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	eps.Register(g)
	if x.ConformanceHooks {
		log.Warn("endpoint picker conformance hooks are on: a client's test-epp-endpoint-selection header steers its request; for conformance runs only")
	}
	return &extProcServer{ln: ln, g: g, eps: eps}, nil
}

// extProcCredentials is the listener's transport: TLS from the certificate directory or a
// self-signed certificate, or plaintext.
func extProcCredentials(x *config.ExtProc, log *slog.Logger) (grpc.ServerOption, error) {
	if x.TLS == nil {
		return grpc.Creds(insecure.NewCredentials()), nil
	}
	var (
		cfg *tls.Config
		err error
	)
	if x.TLS.CertDir != "" {
		cfg, err = extproc.CertDir(x.TLS.CertDir, func(err error) {
			log.Error("endpoint picker certificate not reloaded; serving the previous one", "err", err)
		})
	} else {
		host, _, _ := net.SplitHostPort(x.Listen)
		if host == "" {
			host = "kvrouter"
		}
		cfg, err = extproc.SelfSigned(host)
	}
	if err != nil {
		return nil, err
	}
	return grpc.Creds(credentials.NewTLS(cfg)), nil
}

func (e *extProcServer) addr() string { return e.ln.Addr().String() }

// serve serves until ctx ends, with readiness following the router's (/readyz): ready once it
// has engines to pick from.
func (e *extProcServer) serve(ctx context.Context, srv *app.Router) error {
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			e.eps.SetReady(srv.Ready())
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return e.g.Serve(e.ln)
}

// stop drains the picker: not serving at once, open streams given until ctx ends.
func (e *extProcServer) stop(ctx context.Context) {
	e.eps.Shutdown()
	done := make(chan struct{})
	go func() { e.g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		e.g.Stop()
	}
}
