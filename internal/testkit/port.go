package testkit

import (
	"net"
	"strconv"
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

// FreeRun is the first of n consecutive TCP ports free on every interface a moment ago and not
// in taken, which it adds them to: for a process whose ports are fixed before it starts and
// offset per rank (an engine command rendered with base ports), with FreePort's caveat.
func FreeRun(t testing.TB, n int, taken map[int]bool) int {
	t.Helper()
	for tries := 0; tries < 100; tries++ {
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ok := p+n-1 <= 65535
		for i := 0; ok && i < n; i++ {
			if taken[p+i] {
				ok = false
				break
			}
			l, err := net.Listen("tcp", ":"+strconv.Itoa(p+i))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			for i := 0; i < n; i++ {
				taken[p+i] = true
			}
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}
