package extproc

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// Gateways dial an endpoint picker over TLS without verifying it: the Inference Extension's
// own picker serves a self-signed certificate unless one is mounted (its cmd/epp/runner
// options: --secure-serving on by default, --cert-path holding tls.crt and tls.key), so Istio's
// guide adds a DestinationRule with TLS and NGINX Gateway Fabric skips verification by default.
// A picker the gateways can use serves TLS the same way.

// CertFile and KeyFile are the names inside a certificate directory, those of a
// kubernetes.io/tls Secret mounted as a volume.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// SelfSigned is a certificate for host made at start, valid for a year (client-go's
// GenerateSelfSignedCertKey: a CA and a serving certificate signed by it).
func SelfSigned(host string) (*tls.Config, error) {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, []string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, nil
}

// CertDir serves the certificate in dir (tls.crt, tls.key), read again when either file
// changes (a rotated Secret's volume swaps its files), checked at most once a second and only
// on a handshake: a gateway holds its connection, so handshakes are rare. A certificate that
// fails to load at start is an error; one that fails later keeps the last good one and
// reports through onReloadError.
func CertDir(dir string, onReloadError func(error)) (*tls.Config, error) {
	cfg, _, err := certDir(dir, onReloadError)
	return cfg, err
}

func certDir(dir string, onReloadError func(error)) (*tls.Config, *certReloader, error) {
	r := &certReloader{cert: filepath.Join(dir, CertFile), key: filepath.Join(dir, KeyFile), onError: onReloadError}
	if err := r.load(); err != nil {
		return nil, nil, err
	}
	return &tls.Config{GetCertificate: r.get, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, r, nil
}

type certReloader struct {
	cert, key string
	onError   func(error)

	mu         sync.Mutex
	current    *tls.Certificate
	certMod    time.Time
	keyMod     time.Time
	lastCheck  time.Time
	reportedAt time.Time
}

func (r *certReloader) load() error {
	cs, err := os.Stat(r.cert)
	if err != nil {
		return fmt.Errorf("endpoint picker certificate: %w", err)
	}
	ks, err := os.Stat(r.key)
	if err != nil {
		return fmt.Errorf("endpoint picker key: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		return fmt.Errorf("endpoint picker certificate %s and key %s: %w", r.cert, r.key, err)
	}
	r.current, r.certMod, r.keyMod = &cert, cs.ModTime(), ks.ModTime()
	return nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if now.Sub(r.lastCheck) < time.Second {
		return r.current, nil
	}
	r.lastCheck = now
	cs, cerr := os.Stat(r.cert)
	ks, kerr := os.Stat(r.key)
	if cerr == nil && kerr == nil && cs.ModTime().Equal(r.certMod) && ks.ModTime().Equal(r.keyMod) {
		return r.current, nil
	}
	prev := r.current
	if err := r.load(); err != nil {
		r.current = prev
		if r.onError != nil && now.Sub(r.reportedAt) >= time.Minute {
			r.reportedAt = now
			r.onError(err)
		}
	}
	return r.current, nil
}
