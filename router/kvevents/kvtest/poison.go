package kvtest

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// PoisonBlockSize is the block_size of OversizedBlockSizeBatch: 4 hashes x 2^62 wraps a 64-bit
// product to 0.
const PoisonBlockSize = int64(1) << 62

// OversizedBlockSizeBatch returns a payload that once crashed kvrouter in a loop: an
// array batch holding one map-layout BlockStored with four block hashes, no token ids and
// block_size 2^62. The router once checked len(token_ids) == hashes x block_size, which wrapped
// to 0 == len([]), and then sliced token_ids[0:2^62]. It is written with the msgpack library, the
// way msgspec writes a map event (the "type" tag first, None fields as nil), not with the
// project's own encoder, which refuses nothing and so could not be trusted to write it.
func OversizedBlockSizeBatch() []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	must := func(err error) {
		if err != nil {
			panic(err) // writing to a bytes.Buffer does not fail
		}
	}
	must(e.EncodeArrayLen(3))
	must(e.EncodeFloat64(1))
	must(e.EncodeArrayLen(1))
	must(e.EncodeMapLen(8))
	kv := func(k string, v any) {
		must(e.EncodeString(k))
		must(e.Encode(v))
	}
	kv("type", "BlockStored")
	kv("block_hashes", []uint64{1, 2, 3, 4})
	kv("parent_block_hash", nil)
	kv("token_ids", []uint32{})
	kv("block_size", PoisonBlockSize)
	kv("lora_id", nil)
	kv("medium", "GPU")
	kv("lora_name", nil)
	must(e.EncodeNil()) // data_parallel_rank
	return buf.Bytes()
}
