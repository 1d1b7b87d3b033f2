package kvevents

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"sort"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/index"
	"github.com/kvroute/kvroute/router/kvwire"
	"github.com/kvroute/kvroute/router/peersnap"
)

// DefaultParityEvery is how many eligible BlockStored events pass per parity check: one hash of
// block 0 costs about a microsecond, more than re-keying a whole event, and a seed or algorithm
// mismatch fails every check, so a sample shows it within seconds.
const DefaultParityEvery = 8

// Parity configures the parity check: the engines' --prefix-caching-hash-algo and PYTHONHASHSEED.
type Parity struct {
	Algo blockkey.Algo
	Seed string
	// Every: check one of every Every BlockStored events with parent nil (<= 0: DefaultParityEvery).
	Every int
}

// IngestOptions configure an Ingester.
type IngestOptions struct {
	// BlockSize is the block size the router keys requests with; BlockStored events with another
	// size (or, when 0, with another size than the first GPU event that validated) are counted in
	// BlockSizeMismatches (and still indexed: their keys are right for their own size).
	BlockSize int
	// Parity, when set, recomputes vLLM's hash of sampled parent-nil blocks.
	Parity *Parity
	// Peers, when set, compares block 0's engine hash for the same router key across replicas.
	Peers *PeerTable
	// CopyPerStore counts every BlockStored as one physical copy, parent or not, as vLLM's
	// contract has it (tests/v1/core/test_kv_events_contract.py,
	// test_each_copy_of_a_hash_is_stored_and_removed: two copies of a hash, both stored with no
	// parent, each removed on its own eviction). Unset, a parent-nil store of a held hash counts
	// nothing: under kv_cache_report_mode "full" such a store is a re-announced prefix hit that
	// no BlockRemoved will balance. Set it only where no request carries "full".
	CopyPerStore bool
}

// maxShared bounds the shared-storage residency a stream keeps for display: keys come from the
// wire, and past the bound new ones are counted (SharedDropped), not kept.
const maxShared = 1 << 20

// maxOwners bounds the ownership values a stream remembers for display.
const maxOwners = 16

// sharedKey is one residency key of a copy the replica does not hold itself: vLLM counts copies
// per (medium, group, locality, ownership, hash).
type sharedKey struct {
	medium, locality, ownership string
	group                       int64
	hash                        uint64
}

// Ingester applies decoded batches of one stream to its replica in the index. Not safe for
// concurrent use: one per stream, on the goroutine that decodes it.
type Ingester struct {
	ix        *index.Index
	id        index.ReplicaID
	c         *ingestCounters
	blockSize int64
	// groups: group_idx -> whether it is a full-attention group, learned from BlockStored.
	groups map[int64]bool

	hasher      *blockkey.EngineHasher
	parityEvery uint64
	parityN     uint64
	peers       *PeerTable

	copyPerStore bool
	// shared: copies in storage the engine reaches but does not hold (locality REMOTE, shared
	// media), by residency key; shown, never routed on.
	shared map[sharedKey]uint32
	owners []string

	keys    []blockkey.Key
	hashes  []uint64
	digest  []byte
	scratch [4]blockkey.ExtraKey
}

// NewIngester returns an ingester for replica id of ix.
func NewIngester(ix *index.Index, id index.ReplicaID, opts IngestOptions) (*Ingester, error) {
	return newIngester(ix, id, opts, &ingestCounters{})
}

func newIngester(ix *index.Index, id index.ReplicaID, opts IngestOptions, c *ingestCounters) (*Ingester, error) {
	if ix == nil {
		return nil, fmt.Errorf("kvevents: nil index")
	}
	if opts.BlockSize < 0 {
		return nil, fmt.Errorf("kvevents: negative block size %d", opts.BlockSize)
	}
	g := &Ingester{ix: ix, id: id, c: c, blockSize: int64(opts.BlockSize), groups: map[int64]bool{}, peers: opts.Peers,
		copyPerStore: opts.CopyPerStore}
	if p := opts.Parity; p != nil {
		h, err := blockkey.NewEngineHasher(p.Algo, p.Seed)
		if err != nil {
			return nil, fmt.Errorf("kvevents: parity: %w", err)
		}
		g.hasher = h
		g.parityEvery = uint64(p.Every)
		if p.Every <= 0 {
			g.parityEvery = DefaultParityEvery
		}
	}
	return g, nil
}

// Stats returns the ingestion counters (the Ingestion fields of Stats).
func (g *Ingester) Stats() Stats {
	var c counters
	s := c.snapshot("", 0)
	in := g.c
	s.BlockSize = int(in.blockSizeSet.Load())
	s.Events, s.BlocksStored, s.BlocksRemoved = in.events.Load(), in.blocksStored.Load(), in.blocksRemoved.Load()
	s.BlocksReannounced = in.blocksReannounced.Load()
	s.Clears, s.UnknownEvents, s.UnknownParent = in.clears.Load(), in.unknownEvents.Load(), in.unknownParent.Load()
	s.RekeyErrors, s.SkippedGroups, s.SkippedMedia = in.rekeyErrors.Load(), in.skippedGroups.Load(), in.skippedMedia.Load()
	s.UnknownRemoves, s.IndexErrors, s.BlockSizeMismatches = in.unknownRemoves.Load(), in.indexErrors.Load(), in.blockSizeMismatches.Load()
	s.ParityChecked, s.ParityMismatches, s.ParitySkipped = in.parityChecked.Load(), in.parityMismatches.Load(), in.paritySkipped.Load()
	s.SharedStored, s.SharedRemoved, s.SharedDropped = in.sharedStored.Load(), in.sharedRemoved.Load(), in.sharedDropped.Load()
	s.SharedBlocks, s.SharedCopies, s.SessionStores = in.sharedBlocks.Load(), in.sharedCopies.Load(), in.sessionStores.Load()
	s.CopiesStored, s.Owners = in.copiesStored.Load(), ownersOf(in)
	s.TokenlessResolved, s.TokenlessUnresolved = in.tokenlessResolved.Load(), in.tokenlessUnresolved.Load()
	return s
}

// attentionKind reports whether a kv_cache_spec_kind chains prefix blocks one per block_size
// window, which is what router keys model; sliding-window, Mamba and local-attention groups skip
// blocks, and encoder/cross attention is not a prompt prefix.
func attentionKind(kind string) bool {
	switch kind {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// Apply applies every event of b in order. It reports whether an AllBlocksCleared was among them
// (the stream may heal: see the package doc).
func (g *Ingester) Apply(b *kvwire.Batch) (cleared bool) {
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Type {
		case kvwire.EventBlockStored:
			g.stored(&ev.Stored)
		case kvwire.EventBlockRemoved:
			g.removed(&ev.Removed)
		case kvwire.EventAllBlocksCleared:
			// From the GPU block pool: GPU residency goes, offloaded and shared copies stay
			// (docs/features/kv_events.md, read at commit 0aa3ce853c7d).
			if err := g.ix.ClearTier(g.id, index.GPU); err != nil {
				g.c.indexErrors.Add(1)
				continue
			}
			g.c.clears.Add(1)
			cleared = true
		default:
			g.c.unknownEvents.Add(1)
			continue
		}
		g.c.events.Add(1)
	}
	return cleared
}

func (g *Ingester) stored(s *kvwire.BlockStored) {
	grp := s.GroupIdx.V // an absent group_idx is group 0 (engines before v0.20 had one group)
	att := !s.KVCacheSpecKind.OK || attentionKind(s.KVCacheSpecKind.V)
	g.noteGroup(grp, att)
	if !att {
		g.c.skippedGroups.Add(1)
		return
	}
	g.noteMeta(s.Ownership, s.SessionID)
	if s.SessionID.OK {
		// Where a session's cache lives, learnt from the engine (residency aside: a shared
		// or remote copy still says which replica served the session).
		g.ix.NoteSession(g.id, s.SessionID.V)
	}
	tier, res := index.ParseResidency(s.Medium.V, s.Locality.V)
	switch res {
	case index.Unknown:
		g.c.skippedMedia.Add(1)
		return
	case index.Shared:
		g.sharedStore(s.Medium.V, s.Locality.V, s.Ownership.V, grp, s.BlockHashes)
		return
	}
	n := len(s.BlockHashes)
	if n == 0 {
		return
	}
	if len(s.TokenIDs) == 0 && blockkey.ValidBlockSize(s.BlockSize) {
		g.tokenless(s, tier) // sizes from the wire still checked: a bad one is a re-key error below
		return
	}
	// Sizes first: nothing from an event (its block size least of all, which keys every request
	// once learned) is used before they are consistent.
	if err := s.CheckTokens(); err != nil {
		g.c.rekeyErrors.Add(1)
		return
	}
	learned := int64(g.c.blockSizeSet.Load())
	if want := cmp.Or(g.blockSize, learned); want > 0 && s.BlockSize != want {
		g.c.blockSizeMismatches.Add(1)
	}
	if tier == index.GPU && learned == 0 {
		g.c.blockSizeSet.Store(uint64(s.BlockSize))
	}
	parent := blockkey.RootKey
	if s.ParentBlockHash.OK {
		k, ok := g.ix.ParentKey(g.id, s.ParentBlockHash.V.Uint64())
		if !ok {
			g.c.unknownParent.Add(1)
			return
		}
		parent = k
	}
	var err error
	if g.keys, err = s.AppendRouterKeys(g.keys[:0], parent); err != nil {
		g.c.rekeyErrors.Add(1)
		return
	}
	g.hashes = g.hashes[:0]
	for _, h := range s.BlockHashes {
		g.hashes = append(g.hashes, h.Uint64())
	}
	switch {
	case s.ParentBlockHash.OK:
		err = g.ix.StoreNew(g.id, g.hashes, g.keys, tier)
	case g.copyPerStore:
		if g.peers != nil && tier == index.GPU {
			g.peers.Observe(g.keys[0], g.hashes[0], g.id)
		}
		if g.hasher != nil && tier == index.GPU {
			g.parity(s)
		}
		var dups int
		dups, err = g.ix.StoreCopies(g.id, g.hashes, g.keys, tier)
		g.c.copiesStored.Add(uint64(dups))
	default:
		if g.hasher != nil && tier == index.GPU {
			g.parity(s)
		}
		if g.peers != nil && tier == index.GPU {
			g.peers.Observe(g.keys[0], g.hashes[0], g.id)
		}
		var held int
		held, err = g.ix.StoreHeld(g.id, g.hashes, g.keys, tier)
		g.c.blocksReannounced.Add(uint64(held))
	}
	if errors.Is(err, index.ErrFull) {
		g.c.overLimit.Add(1) // what fit was stored; the stream clears the replica
		return
	}
	if err != nil {
		g.c.indexErrors.Add(1)
		return
	}
	g.c.blocksStored.Add(uint64(n))
}

// parity recomputes block 0's vLLM hash for one in parityEvery parent-nil events. Block 0 is the
// only one whose full parent digest (NONE_HASH) the router knows from wire ints.
func (g *Ingester) parity(s *kvwire.BlockStored) {
	g.parityN++
	if (g.parityN-1)%g.parityEvery != 0 {
		return
	}
	bs := int(s.BlockSize)
	if bs <= 0 || len(s.TokenIDs) < bs {
		g.c.paritySkipped.Add(1) // not reached: stored checked the sizes; kept so parity stands alone
		return
	}
	ex, err := s.BlockExtras(g.scratch[:0], 0)
	if err == nil {
		g.digest, err = g.hasher.HashBlock(g.digest[:0], nil, s.TokenIDs[:bs], ex)
	}
	if err != nil {
		g.c.paritySkipped.Add(1)
		return
	}
	g.c.parityChecked.Add(1)
	h := s.BlockHashes[0]
	same := blockkey.WireInt(g.digest) == h.Uint64()
	if h.IsBytes() {
		same = bytes.Equal(g.digest, h.Bytes)
	}
	if !same {
		g.c.parityMismatches.Add(1)
	}
}

// maxGroups bounds the group_idx values an ingester remembers: vLLM has one KV cache group per
// distinct layer spec (a handful even for hybrid models), but the value comes from the wire and a
// map keyed by it would grow with whatever a publisher sends. Past the bound a new group is not
// remembered; its BlockStored events are still judged by their own kv_cache_spec_kind.
const maxGroups = 64

func (g *Ingester) noteGroup(grp int64, attention bool) {
	if _, seen := g.groups[grp]; seen || len(g.groups) < maxGroups {
		g.groups[grp] = attention
	}
}

func (g *Ingester) removed(r *kvwire.BlockRemoved) {
	if att, seen := g.groups[r.GroupIdx.V]; seen && !att {
		g.c.skippedGroups.Add(1)
		return
	}
	tier, res := index.ParseResidency(r.Medium.V, r.Locality.V)
	switch res {
	case index.Unknown:
		g.c.skippedMedia.Add(1)
		return
	case index.Shared:
		g.sharedRemove(r.Medium.V, r.Locality.V, r.Ownership.V, r.GroupIdx.V, r.BlockHashes)
		return
	}
	g.hashes = g.hashes[:0]
	for _, h := range r.BlockHashes {
		g.hashes = append(g.hashes, h.Uint64())
	}
	unknown, err := g.ix.Remove(g.id, g.hashes, tier)
	if err != nil {
		g.c.indexErrors.Add(1)
		return
	}
	g.c.unknownRemoves.Add(uint64(unknown))
	g.c.blocksRemoved.Add(uint64(len(g.hashes) - unknown))
}

// export writes what the ingester learned (block size, KV cache groups) into a snapshot.
func (g *Ingester) export(sn *peersnap.Stream) {
	sn.BlockSize = uint32(g.c.blockSizeSet.Load())
	for idx, full := range g.groups {
		sn.Groups = append(sn.Groups, peersnap.Group{Idx: idx, Full: full})
	}
	sort.Slice(sn.Groups, func(i, j int) bool { return sn.Groups[i].Idx < sn.Groups[j].Idx })
}

// restore takes what a peer's ingester learned, within this one's bounds.
func (g *Ingester) restore(sn *peersnap.Stream) {
	if sn.BlockSize > 0 && g.c.blockSizeSet.Load() == 0 {
		g.c.blockSizeSet.Store(uint64(sn.BlockSize))
	}
	for _, gr := range sn.Groups {
		g.noteGroup(gr.Idx, gr.Full)
	}
}

// sharedStore counts one more copy per hash under its residency key, in storage the replica
// does not hold itself (see index.Shared).
func (g *Ingester) sharedStore(medium, locality, owner string, grp int64, hs []kvwire.Hash) {
	if g.shared == nil {
		g.shared = map[sharedKey]uint32{}
	}
	for _, h := range hs {
		k := sharedKey{medium: medium, locality: locality, ownership: owner, group: grp, hash: h.Uint64()}
		n, ok := g.shared[k]
		if !ok && len(g.shared) >= maxShared {
			g.c.sharedDropped.Add(1)
			continue
		}
		g.shared[k] = n + 1
		g.c.sharedStored.Add(1)
		g.c.sharedCopies.Add(1)
	}
	g.c.sharedBlocks.Store(uint64(len(g.shared)))
}

// sharedRemove takes one copy per hash away; the key goes with its last copy.
func (g *Ingester) sharedRemove(medium, locality, owner string, grp int64, hs []kvwire.Hash) {
	for _, h := range hs {
		k := sharedKey{medium: medium, locality: locality, ownership: owner, group: grp, hash: h.Uint64()}
		switch n := g.shared[k]; n {
		case 0:
			g.c.unknownRemoves.Add(1)
			continue
		case 1:
			delete(g.shared, k)
		default:
			g.shared[k] = n - 1
		}
		g.c.sharedRemoved.Add(1)
		g.c.sharedCopies.Add(^uint64(0))
	}
	g.c.sharedBlocks.Store(uint64(len(g.shared)))
}

// noteMeta keeps what a BlockStored says about who owns it and which session it was for:
// ownership values (a few per engine: bounded) and a count of session-tagged stores.
func (g *Ingester) noteMeta(owner, session kvwire.Opt[string]) {
	if session.OK {
		g.c.sessionStores.Add(1)
	}
	if !owner.OK || len(g.owners) >= maxOwners {
		return
	}
	for _, o := range g.owners {
		if o == owner.V {
			return
		}
	}
	g.owners = append(g.owners, owner.V)
	list := append([]string(nil), g.owners...)
	g.c.owners.Store(&list)
}

// tokenless applies a BlockStored that carries hashes but no token ids: an engine snapshot's
// tier update for blocks whose tokens came in an earlier store (docs/features/kv_events.md,
// "tokenless offload entries"). Router keys cannot be computed without tokens, so each hash is
// resolved through the exact engine hash where the replica already holds it (on any tier: the
// same hash is the same content) and counted where it does not.
func (g *Ingester) tokenless(s *kvwire.BlockStored, tier index.Tier) {
	g.hashes, g.keys = g.hashes[:0], g.keys[:0]
	for _, h := range s.BlockHashes {
		k, ok := g.ix.ParentKey(g.id, h.Uint64())
		if !ok {
			g.c.tokenlessUnresolved.Add(1)
			continue
		}
		g.hashes, g.keys = append(g.hashes, h.Uint64()), append(g.keys, k)
	}
	if len(g.hashes) == 0 {
		return
	}
	_, err := g.ix.StoreCopies(g.id, g.hashes, g.keys, tier)
	switch {
	case errors.Is(err, index.ErrFull):
		g.c.overLimit.Add(1)
		return
	case err != nil:
		g.c.indexErrors.Add(1)
		return
	}
	g.c.tokenlessResolved.Add(uint64(len(g.hashes)))
	g.c.blocksStored.Add(uint64(len(g.hashes)))
}
