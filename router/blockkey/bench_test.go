package blockkey

import "testing"

func benchPromptKeys(b *testing.B, n int) {
	tokens := seqTokens(n, 1)
	dst := make([]Key, 0, n/16)
	b.SetBytes(int64(4 * n))
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = AppendPromptKeys(dst[:0], tokens, 16, Identity{})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n/16), "ns/block")
}

func BenchmarkRouterKeys32k(b *testing.B)  { benchPromptKeys(b, 32*1024) }
func BenchmarkRouterKeys100k(b *testing.B) { benchPromptKeys(b, 100*1000) }

func BenchmarkRouterKeys32kLoRA(b *testing.B) {
	tokens := seqTokens(32*1024, 1)
	dst := make([]Key, 0, len(tokens)/16)
	id := Identity{LoRAName: "sql-adapter", CacheSalt: "tenant"}
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = AppendPromptKeys(dst[:0], tokens, 16, id)
	}
}

func BenchmarkEngineHashBlock(b *testing.B) {
	tokens := seqTokens(16, 128000)
	for _, algo := range Algos {
		b.Run(string(algo), func(b *testing.B) {
			h, err := NewEngineHasher(algo, "0")
			if err != nil {
				b.Fatal(err)
			}
			parent := append([]byte(nil), h.NoneHash()...)
			out := make([]byte, 0, 32)
			b.ReportAllocs()
			for b.Loop() {
				out, _ = h.HashBlock(out[:0], parent, tokens, nil)
			}
		})
	}
}
