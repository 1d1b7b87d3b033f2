package capture

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"
)

// BlockTokens is the granularity of a Mooncake trace: each hash id stands for 512 tokens.
const BlockTokens = 512

// Identity is what changes KV content besides the tokens (blockkey.Identity's fields): two
// requests with the same tokens but another LoRA adapter or cache salt share no block.
type Identity struct {
	LoRA      string
	CacheSalt string
}

// chainer computes keyed, chained block hashes. The key is the capture's secret salt, so the
// hashes (and the dense ids written from them) cannot be linked to token ids, to the router's
// block keys, or to another capture's ids.
//
// The rule, as Mooncake traces follow it (len(hash_ids) == ceil(input_length / 512) on every
// line of the released traces, and a partial last block's id never appears as a non-last
// block anywhere):
//
//	h(-1) = HMAC(salt, "kvroute-capture/1" | len(lora) | lora | len(salt') | salt')
//	h(i)  = HMAC(salt, h(i-1) | n(i) | tokens[512i : 512i+n(i)])   (little-endian uint32s)
//
// for every 512-token chunk i, the last one included even when it is partial (n < 512): it
// gets its own id, which differs from the id of the full chunk a longer prompt has there
// because n is hashed. Equal ids mean equal tokens from the start of the prompt to the end of
// that chunk, with the same adapter and cache salt.
type chainer struct {
	pool sync.Pool // *hmacState
}

type hmacState struct {
	mac hash.Hash
	buf []byte
	sum []byte
}

func newChainer(salt []byte) *chainer {
	key := append([]byte(nil), salt...)
	c := &chainer{}
	c.pool.New = func() any {
		return &hmacState{mac: hmac.New(sha256.New, key), buf: make([]byte, 0, 4*BlockTokens+8), sum: make([]byte, 0, sha256.Size)}
	}
	return c
}

// appendChain appends one 64-bit keyed hash per chunk of toks (ceil(len/512) of them).
func (c *chainer) appendChain(dst []uint64, toks []uint32, id Identity) []uint64 {
	st := c.pool.Get().(*hmacState)
	defer c.pool.Put(st)
	st.mac.Reset()
	st.buf = append(st.buf[:0], "kvroute-capture/1"...)
	st.buf = appendString(st.buf, id.LoRA)
	st.buf = appendString(st.buf, id.CacheSalt)
	st.mac.Write(st.buf)
	st.sum = st.mac.Sum(st.sum[:0])
	for start := 0; start < len(toks); start += BlockTokens {
		chunk := toks[start:min(start+BlockTokens, len(toks))]
		st.mac.Reset()
		st.buf = append(st.buf[:0], st.sum...)
		st.buf = binary.LittleEndian.AppendUint32(st.buf, uint32(len(chunk)))
		for _, t := range chunk {
			st.buf = binary.LittleEndian.AppendUint32(st.buf, t)
		}
		st.mac.Write(st.buf)
		st.sum = st.mac.Sum(st.sum[:0])
		dst = append(dst, binary.LittleEndian.Uint64(st.sum))
	}
	return dst
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
