package peersync

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testkit"
)

// writeCerts writes a CA and a certificate it signed for 127.0.0.1 (client and server use), and
// returns the files; other is a second CA's certificate, which the routers must refuse.
func writeCerts(t *testing.T) (ours, stranger TLSFiles) {
	t.Helper()
	dir := t.TempDir()
	mk := func(name string) TLSFiles {
		caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + "-ca"}, IsCA: true,
			BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		ca, _ := x509.ParseCertificate(caDER)
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		f := TLSFiles{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key"), CAFile: filepath.Join(dir, name+"-ca.crt")}
		for path, block := range map[string]*pem.Block{f.CertFile: {Type: "CERTIFICATE", Bytes: der},
			f.KeyFile: {Type: "EC PRIVATE KEY", Bytes: kb}, f.CAFile: {Type: "CERTIFICATE", Bytes: caDER}} {
			if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	return mk("router"), mk("stranger")
}

func startTLSRouter(t *testing.T, id string, files TLSFiles, routes ...string) *testRouter {
	t.Helper()
	r := &testRouter{share: NewShare(), local: map[string]Load{}}
	n, err := Start(Options{ID: id, ClusterListen: "127.0.0.1:0", Routes: routes, Sink: r.share, Totals: r.totals, TLS: &files,
		Flush: 10 * time.Millisecond, Heartbeat: 100 * time.Millisecond, PeerTimeout: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r.node = n
	t.Cleanup(n.Close)
	return r
}

// With TLS the routes are mutual TLS: routers with certificates of the same CA share their load;
// a server whose certificate another CA signed never joins.
func TestTLSRoutes(t *testing.T) {
	ours, stranger := writeCerts(t)
	a := startTLSRouter(t, "a", ours)
	b := startTLSRouter(t, "b", ours, a.node.ClusterAddr())
	testkit.WaitFor(t, waitBound, "the TLS route", func() bool { return len(a.node.Peers()) == 1 && len(b.node.Peers()) == 1 })
	a.route(1, "e0/0", 10)
	testkit.WaitFor(t, waitBound, "b sees a's load over TLS", func() bool { return b.share.Of("e0/0").Running == 1 })

	x := startTLSRouter(t, "x", stranger, a.node.ClusterAddr())
	time.Sleep(1500 * time.Millisecond) // a bound for a join that must not happen
	if n := len(x.node.Peers()); n != 0 || len(a.node.Peers()) != 1 {
		t.Fatalf("a router with another CA's certificate joined: x sees %d peers, a sees %d", n, len(a.node.Peers()))
	}
}
