package index

import (
	"fmt"
	"testing"
)

// The session map: the last replica to store for a session is its home; the map is bounded
// (least recently stored first, counted); a replica cleared (restart) or removed (and its slot
// reused) is no session's home any more.
func TestSessionHomes(t *testing.T) {
	ix := New(Options{})
	a, _ := ix.AddReplica("a", 0)
	b, _ := ix.AddReplica("b", 0)
	ix.NoteSession(a, "s1")
	if id, ok := ix.SessionReplica("s1"); !ok || id != a {
		t.Fatalf("s1 -> %v %v, want a", id, ok)
	}
	ix.NoteSession(b, "s1") // the session moved: the latest store wins
	if id, ok := ix.SessionReplica("s1"); !ok || id != b {
		t.Fatalf("s1 -> %v %v, want b", id, ok)
	}
	if _, ok := ix.SessionReplica("other"); ok {
		t.Fatal("an unknown session has a home")
	}
	ix.NoteSession(ReplicaID(40), "s9") // not registered: ignored
	if _, ok := ix.SessionReplica("s9"); ok {
		t.Fatal("a session homed on an unregistered replica")
	}

	// Bounded: 3 sessions, the least recently stored goes first.
	ix.SetSessionLimit(3)
	for i := range 5 {
		ix.NoteSession(a, fmt.Sprintf("k%d", i))
	}
	ix.NoteSession(a, "k2") // refreshed: k3 is now the oldest
	ix.NoteSession(a, "k5")
	st := ix.SessionStats()
	if st.Sessions != 3 || st.Max != 3 || st.Evicted != 4 {
		t.Fatalf("stats %+v, want 3 sessions of 3, 4 evicted (s1, k0, k1, k3)", st)
	}
	for s, want := range map[string]bool{"k2": true, "k4": true, "k5": true, "k3": false, "s1": false} {
		if _, ok := ix.SessionReplica(s); ok != want {
			t.Errorf("%s known = %v, want %v", s, ok, want)
		}
	}

	// A cleared replica (restart, inexact stream) lost its cache: no home until it stores again.
	if err := ix.Clear(a); err != nil {
		t.Fatal(err)
	}
	if _, ok := ix.SessionReplica("k5"); ok {
		t.Fatal("a cleared replica is still k5's home")
	}
	ix.NoteSession(a, "k5")
	if id, ok := ix.SessionReplica("k5"); !ok || id != a {
		t.Fatal("k5 stored again after the clear: no home")
	}
	// A removed replica whose slot a new stream reuses is not the old sessions' home.
	if err := ix.RemoveReplica(a); err != nil {
		t.Fatal(err)
	}
	c, _ := ix.AddReplica("c", 0)
	if c != a {
		t.Fatalf("slot not reused (%d, %d): the test needs it", c, a)
	}
	if _, ok := ix.SessionReplica("k5"); ok {
		t.Fatal("the new stream in a's old slot inherited a's session")
	}
}
