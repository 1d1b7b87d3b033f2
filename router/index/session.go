package index

import (
	"container/list"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// DefaultSessionHomes is how many sessions the index remembers a home replica for: a session
// costs one map entry and one list element (about 100 bytes), so 100,000 stay near 10 MB.
const DefaultSessionHomes = 100_000

// sessionHomes remembers, per session, the replica whose engine last stored blocks for it: vLLM
// tags a BlockStored with the request's session_id (vLLM #51381; SGLang's metadata carries one
// too), so the index learns where a conversation's cache lives from the engines themselves,
// whichever router routed it. Bounded: least recently stored sessions go first, counted.
// Sessions are kept by their 64-bit hash, so an engine's long or many session ids cost no more
// than short ones.
type sessionHomes struct {
	mu      sync.Mutex
	max     int
	byHash  map[uint64]*list.Element
	lru     list.List // of *sessionHome, most recently stored at the front
	evicted atomic.Uint64
	noted   atomic.Uint64
}

type sessionHome struct {
	hash  uint64
	id    ReplicaID
	epoch uint64 // the replica's epoch when stored: a cleared or re-used slot no longer matches
}

// SessionStats is what the session map holds and has dropped.
type SessionStats struct {
	Sessions int    `json:"sessions"`  // sessions with a home replica now
	Max      int    `json:"max"`       // the bound
	Noted    uint64 `json:"noted"`     // session-tagged stores learnt from
	Evicted  uint64 `json:"evictions"` // sessions dropped for the bound
}

func sessionHash(session string) uint64 { return xxh3.HashString(session) }

// SetSessionLimit bounds the session map (n <= 0: DefaultSessionHomes); sessions past a lower
// bound are dropped, least recently stored first, and counted.
func (ix *Index) SetSessionLimit(n int) {
	if n <= 0 {
		n = DefaultSessionHomes
	}
	s := &ix.sessions
	s.mu.Lock()
	defer s.mu.Unlock()
	s.max = n
	s.trim()
}

// NoteSession records that replica id's engine stored blocks for session (a BlockStored's
// session_id). The replica must be registered; an unknown one is ignored.
func (ix *Index) NoteSession(id ReplicaID, session string) {
	if session == "" {
		return
	}
	ix.mu.RLock()
	var epoch uint64
	ok := int(id) < len(ix.reps) && ix.reps[id] != nil
	if ok {
		epoch = ix.reps[id].epoch
	}
	ix.mu.RUnlock()
	if !ok {
		return
	}
	s := &ix.sessions
	h := sessionHash(session)
	s.noted.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byHash == nil {
		s.byHash = map[uint64]*list.Element{}
		if s.max <= 0 {
			s.max = DefaultSessionHomes
		}
	}
	if e, ok := s.byHash[h]; ok {
		home := e.Value.(*sessionHome)
		home.id, home.epoch = id, epoch
		s.lru.MoveToFront(e)
		return
	}
	s.byHash[h] = s.lru.PushFront(&sessionHome{hash: h, id: id, epoch: epoch})
	s.trim()
}

// trim drops the least recently stored sessions past the bound. s.mu is held.
func (s *sessionHomes) trim() {
	for s.lru.Len() > s.max {
		e := s.lru.Back()
		delete(s.byHash, e.Value.(*sessionHome).hash)
		s.lru.Remove(e)
		s.evicted.Add(1)
	}
}

// SessionReplica is the replica whose engine last stored blocks for session, if the index
// knows one and that replica has not been cleared (restarted, found inexact) or removed since.
func (ix *Index) SessionReplica(session string) (ReplicaID, bool) {
	if session == "" {
		return 0, false
	}
	s := &ix.sessions
	s.mu.Lock()
	e, ok := s.byHash[sessionHash(session)]
	var home sessionHome
	if ok {
		home = *e.Value.(*sessionHome)
	}
	s.mu.Unlock()
	if !ok {
		return 0, false
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if int(home.id) >= len(ix.reps) || ix.reps[home.id] == nil || ix.reps[home.id].epoch != home.epoch {
		return 0, false
	}
	return home.id, true
}

// SessionStats reads the session map's size and counters.
func (ix *Index) SessionStats() SessionStats {
	s := &ix.sessions
	s.mu.Lock()
	n, max := s.lru.Len(), s.max
	s.mu.Unlock()
	if max <= 0 {
		max = DefaultSessionHomes
	}
	return SessionStats{Sessions: n, Max: max, Noted: s.noted.Load(), Evicted: s.evicted.Load()}
}
