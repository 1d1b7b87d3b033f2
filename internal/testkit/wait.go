package testkit

import (
	"testing"
	"time"
)

// How often Until and WaitFor look again: soon at first, so that a condition that holds
// within milliseconds is seen within milliseconds (several tests time how long one took),
// then less often, so that a long wait does not spin. Eventually's f usually asks a server (an
// API server, a router that is sent a request each time), so it waits longer between tries.
const (
	untilFirst      = time.Millisecond
	untilEvery      = 20 * time.Millisecond
	eventuallyEvery = 100 * time.Millisecond
)

// Until polls cond until it holds, and reports whether it did before timeout passed. It is for
// a caller that fails with its own account of what it last saw; WaitFor fails for it.
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	every := untilFirst
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
		every = min(2*every, untilEvery)
	}
	return true
}

// WaitFor polls cond until it holds, failing t when timeout passes first (a bound, not a
// synchronisation sleep).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
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
