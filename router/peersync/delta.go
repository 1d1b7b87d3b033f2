// Package peersync shares in-flight load between router replicas over NATS core
// publish/subscribe: each router publishes its ledger's changes in batches and applies its peers'
// into a per-peer share that the decisions read. A decision never waits on the network: a
// change is appended to a buffer under a mutex and a flusher goroutine publishes it; a peer's
// batch replaces that peer's share when it arrives.
//
// What travels (Batch): the changes since the last batch (Delta: routed with the predicted
// blocks, first token, done, failed; per request and replica) and the publisher's totals per
// replica at the moment it flushed. Core NATS delivers at most once, so a receiver takes the
// totals as the peer's share (a lost batch costs at most one flush interval of error, never a
// drift) and the deltas for what totals cannot carry: the routed request's predicted blocks,
// which go into the receiver's predicted side index so siblings split across routers still
// co-locate. A peer whose batches stop (dead, partitioned) is dropped after PeerTimeout.
//
// The ledger (router/load, per request: Routed -> FirstToken -> Done/Failed) is the producer:
// router/app observes it (a load.Observer) and calls Node.Record for each transition of a
// local request. The sink is router/app's too: Share holds the peers' totals a decision adds
// to its own, and the routed keys go to the ledger's predicted index.
package peersync

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/router/bincodec"
	"github.com/kvroute/kvroute/router/blockkey"
)

// Kind is a ledger transition.
type Kind uint8

const (
	// Routed: the request was sent to the replica; Prefill uncached prompt tokens wait for their
	// first token, Keys are the blocks the decision predicts the replica will cache.
	Routed Kind = iota + 1
	// FirstToken: the prefill is over; Tokens prompt tokens now count as decode.
	FirstToken
	// Done: the request ended.
	Done
	// Failed: the attempt failed (before or after its first token); its load is gone and its
	// predicted blocks should be taken back.
	Failed
)

func (k Kind) String() string {
	switch k {
	case Routed:
		return "routed"
	case FirstToken:
		return "first_token"
	case Done:
		return "done"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Delta is one ledger transition of one request on one replica.
type Delta struct {
	Kind Kind
	// Request is the publishing router's id of the attempt (unique per router process).
	Request uint64
	// Replica is "engine/rank", the name every router gives the replica (same discovery).
	Replica string
	// Prefill is the uncached prompt tokens (Routed), Tokens the prompt tokens (Routed,
	// FirstToken).
	Prefill, Tokens int64
	// Keys are the predicted blocks of a Routed request, the first MaxKeys at most.
	Keys []blockkey.Key
}

// Load is one replica's in-flight work as one router sees it.
type Load struct {
	Prefill, Decode, Running int64
}

// Add returns l + o.
func (l Load) Add(o Load) Load {
	return Load{l.Prefill + o.Prefill, l.Decode + o.Decode, l.Running + o.Running}
}

// Total is one replica's load on the publishing router when it flushed.
type Total struct {
	Replica string
	Load
}

// Batch is one message on the subject.
type Batch struct {
	// Peer is the publishing router's ID, Epoch its process start (unix ns): a restarted router
	// with the same name is a new peer.
	Peer  string
	Epoch int64
	// Seq counts the publisher's batches (gaps show lost messages).
	Seq uint64
	// Sent is the publisher's clock at flush (unix ns): sync lag = receive time - Sent.
	Sent int64
	// SnapshotURL is where the peer serves its index snapshot ("" when it does not); Ready says
	// whether the peer is ready (a starting router takes its snapshot only from a ready peer).
	SnapshotURL string
	Ready       bool
	Deltas      []Delta
	Totals      []Total
}

const batchVersion = 1

// Bounds on what DecodeBatch accepts: NATS itself caps a message at its max payload (1 MiB
// configured here); these keep one message from naming more than a router would send.
const (
	maxString  = 512
	maxDeltas  = 1 << 16
	maxTotals  = 1 << 16
	maxKeysCap = 1 << 14
)

// ErrFormat wraps every decoding failure.
var ErrFormat = errors.New("peersync: bad batch")

// EncodeBatch appends b to dst.
func EncodeBatch(dst []byte, b *Batch) []byte {
	dst = binary.AppendUvarint(dst, batchVersion)
	dst = bincodec.AppendString(dst, b.Peer)
	dst = binary.AppendVarint(dst, b.Epoch)
	dst = binary.AppendUvarint(dst, b.Seq)
	dst = binary.AppendVarint(dst, b.Sent)
	dst = bincodec.AppendString(dst, b.SnapshotURL)
	ready := uint64(0)
	if b.Ready {
		ready = 1
	}
	dst = binary.AppendUvarint(dst, ready)
	dst = binary.AppendUvarint(dst, uint64(len(b.Deltas)))
	for i := range b.Deltas {
		d := &b.Deltas[i]
		dst = append(dst, byte(d.Kind))
		dst = binary.AppendUvarint(dst, d.Request)
		dst = bincodec.AppendString(dst, d.Replica)
		dst = binary.AppendVarint(dst, d.Prefill)
		dst = binary.AppendVarint(dst, d.Tokens)
		dst = binary.AppendUvarint(dst, uint64(len(d.Keys)))
		for _, k := range d.Keys {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(k))
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Totals)))
	for _, t := range b.Totals {
		dst = bincodec.AppendString(dst, t.Replica)
		dst = binary.AppendVarint(dst, t.Prefill)
		dst = binary.AppendVarint(dst, t.Decode)
		dst = binary.AppendVarint(dst, t.Running)
	}
	return dst
}

// DecodeBatch parses a batch, checking every length against the input and the bounds above. It
// never panics and allocates in proportion to len(p).
func DecodeBatch(p []byte) (*Batch, error) {
	r := bincodec.NewReader(p, ErrFormat)
	if v := r.Uvarint("version"); r.Err() == nil && v != batchVersion {
		return nil, fmt.Errorf("%w: version %d, this router reads %d", ErrFormat, v, batchVersion)
	}
	b := &Batch{}
	b.Peer = r.String("peer", maxString)
	b.Epoch = r.Varint("epoch")
	b.Seq = r.Uvarint("seq")
	b.Sent = r.Varint("sent")
	b.SnapshotURL = r.String("snapshot URL", maxString)
	switch r.Uvarint("ready flag") {
	case 0:
	case 1:
		b.Ready = true
	default:
		r.Fail("ready flag not 0 or 1")
	}
	n := r.Count("deltas", maxDeltas, 1+1+1+1+1+1)
	if n > 0 {
		b.Deltas = make([]Delta, n)
	}
	for i := 0; i < n && r.Err() == nil; i++ {
		d := &b.Deltas[i]
		k := r.Byte("delta kind")
		if k < byte(Routed) || k > byte(Failed) {
			r.Fail("delta kind %d", k)
		}
		d.Kind = Kind(k)
		d.Request = r.Uvarint("request")
		d.Replica = r.String("replica", maxString)
		d.Prefill = r.Varint("prefill")
		d.Tokens = r.Varint("tokens")
		nk := r.Count("keys", maxKeysCap, 8)
		if nk > 0 {
			d.Keys = make([]blockkey.Key, nk)
		}
		for j := 0; j < nk && r.Err() == nil; j++ {
			d.Keys[j] = blockkey.Key(r.U64("key"))
		}
	}
	nt := r.Count("totals", maxTotals, 1+1+1+1)
	if nt > 0 {
		b.Totals = make([]Total, nt)
	}
	for i := 0; i < nt && r.Err() == nil; i++ {
		t := &b.Totals[i]
		t.Replica = r.String("replica", maxString)
		t.Prefill = r.Varint("prefill")
		t.Decode = r.Varint("decode")
		t.Running = r.Varint("running")
	}
	r.End()
	if r.Err() != nil {
		return nil, r.Err()
	}
	return b, nil
}
