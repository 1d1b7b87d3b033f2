package kvwire

import (
	"testing"

	"github.com/kvroute/kvroute/router/blockkey"
)

// benchDecode reports blocks/s: BlockStored hashes plus BlockRemoved hashes per second.
func benchDecode(b *testing.B, payload []byte) {
	d := NewDecoder()
	first, err := d.DecodeBatch(payload)
	if err != nil {
		b.Fatal(err)
	}
	blocks := 0
	for _, e := range first.Events {
		blocks += len(e.Stored.BlockHashes) + len(e.Removed.BlockHashes)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.DecodeBatch(payload); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}

// A realistic large batch: one BlockStored of 128 blocks (2048 tokens) and 32 evictions.
func bigBatch() *Batch {
	s := BlockStored{BlockSize: 16, Medium: Some("GPU"), GroupIdx: Some[int64](0), KVCacheSpecKind: Some("full_attention"), ParentBlockHash: Some(IntHash(99))}
	ek := make([]blockkey.Extras, 128)
	for i := 0; i < 128; i++ {
		s.BlockHashes = append(s.BlockHashes, IntHash(uint64(i)*0x9e3779b97f4a7c15))
		for j := 0; j < 16; j++ {
			s.TokenIDs = append(s.TokenIDs, uint32(100000+i*16+j))
		}
	}
	s.ExtraKeys = Some(ek)
	b := &Batch{TS: 1.25, DataParallelRank: Some[int64](0), Events: []Event{{Type: EventBlockStored, Tag: TagBlockStored, Stored: s}}}
	for i := 0; i < 32; i++ {
		b.Events = append(b.Events, Event{Type: EventBlockRemoved, Tag: TagBlockRemoved,
			Removed: BlockRemoved{BlockHashes: []Hash{IntHash(uint64(i))}, Medium: Some("GPU"), GroupIdx: Some[int64](0)}})
	}
	return b
}

// BenchmarkDecode: "map" is shape E3, "array" E1, "map-batch" E2 (names kept from before the
// shapes had names, so figures compare across versions).
func BenchmarkDecode(b *testing.B) {
	for _, bc := range []struct {
		name  string
		shape Shape
	}{{"map", ShapeE3}, {"array", ShapeE1}, {"map-batch", ShapeE2}} {
		payload, err := NewEncoder().AppendBatchShape(nil, bigBatch(), bc.shape)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) { benchDecode(b, payload) })
	}
}

func BenchmarkEncodeMap(b *testing.B) {
	batch := bigBatch()
	enc := NewEncoder()
	var out []byte
	b.ReportAllocs()
	for b.Loop() {
		out, _ = enc.AppendBatch(out[:0], batch, LayoutMap)
	}
}
