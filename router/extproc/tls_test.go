package extproc

import (
	"bytes"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

func writePair(t *testing.T, dir, host string, mod time.Time) []byte {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{CertFile: certPEM, KeyFile: keyPEM} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c.Certificate[0]
}

// A rotated certificate (a Secret's volume swapping its files) is served from the next
// handshake after the check interval; a broken rotation keeps the last good one and says so.
func TestCertDirReloads(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Now().Add(-time.Hour)
	first := writePair(t, dir, "picker-a", t0)
	var reloadErrs []error
	cfg, r, err := certDir(dir, func(err error) { reloadErrs = append(reloadErrs, err) })
	if err != nil {
		t.Fatal(err)
	}
	served := func() []byte {
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Certificate[0]
	}
	if !bytes.Equal(served(), first) {
		t.Fatal("the first certificate is not served")
	}
	second := writePair(t, dir, "picker-b", t0.Add(time.Minute))
	if !bytes.Equal(served(), first) {
		t.Fatal("the files were read again within the check interval")
	}
	r.lastCheck = time.Time{}
	if !bytes.Equal(served(), second) {
		t.Fatal("the rotated certificate is not served after the check interval")
	}
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.lastCheck = time.Time{}
	if !bytes.Equal(served(), second) || len(reloadErrs) != 1 || !strings.Contains(reloadErrs[0].Error(), KeyFile) {
		t.Fatalf("a broken rotation: want the last good certificate and one error naming the key, got errors %v", reloadErrs)
	}
}

func TestCertDirMissingFiles(t *testing.T) {
	if _, err := CertDir(t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), CertFile) {
		t.Fatalf("want an error naming %s, got %v", CertFile, err)
	}
}
