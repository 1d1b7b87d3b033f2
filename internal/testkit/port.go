package testkit

import (
	"net"
	"testing"
)

// FreePort is a TCP port free on 127.0.0.1 a moment ago. Another process can take it before
// the one it is meant for binds it, so it is for the few places where the port must be known
// before the process starts (a cluster address peers are given, a router whose listening line
// is hidden); elsewhere a process takes port 0 and reports what it got.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
