package testkit

import (
	"testing"
	"time"
)

// How often WaitFor and Eventually look again. Eventually's f usually asks a server (an API
// server, a router that is sent a request each time), so it waits longer between tries.
const (
	waitForEvery    = 50 * time.Millisecond
	eventuallyEvery = 100 * time.Millisecond
)

// WaitFor polls cond until it holds, failing t when timeout passes first (a bound, not a
// synchronisation sleep).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(waitForEvery)
	}
}

// Eventually polls f until it returns nil, failing t with f's last error when timeout passes
// first.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after %v: %v", what, timeout, err)
		}
		time.Sleep(eventuallyEvery)
	}
}
