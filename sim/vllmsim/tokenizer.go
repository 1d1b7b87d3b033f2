package vllmsim

import (
	"fmt"
	"strconv"
	"strings"
)

// The simulator's tokenizer is deterministic and exactly reversible, so /tokenize, /detokenize,
// the render endpoints and the completions all agree, and a router can rely on them as it would
// on vLLM's. It is written by hand because no real tokenizer is needed: only stable ids.
//
// Vocabulary (151,936 ids, Qwen2's size):
//
//	0..255             one byte (only for a trailing odd byte)
//	256..65791         two bytes b0 b1: 256 + b0<<8 | b1
//	65792..151642      no text of their own: written "<|id_N|>" by Detokenize and read back by Tokenize
//	151643             <|endoftext|>
//	151644, 151645     <|im_start|>, <|im_end|> (the chat template's markers)
//	151646..151935     "<|id_N|>" as above
//
// Text is split at the special markers; every other run of bytes is cut into 2-byte tokens
// from its start (about 2 bytes a token; a shared text prefix gives a shared token prefix except
// at its last, odd byte, much as with BPE). No BOS token is added (Qwen2 adds none), so
// add_special_tokens changes nothing.
const (
	pairBase      = 256
	firstOpaqueID = pairBase + 1<<16
	tokEndOfText  = 151643
	tokImStart    = 151644
	tokImEnd      = 151645
)

var specialTokens = map[string]uint32{
	"<|endoftext|>": tokEndOfText,
	"<|im_start|>":  tokImStart,
	"<|im_end|>":    tokImEnd,
}

var specialText = map[uint32]string{
	tokEndOfText: "<|endoftext|>",
	tokImStart:   "<|im_start|>",
	tokImEnd:     "<|im_end|>",
}

// Tokenize turns text into token ids (see the vocabulary above).
func Tokenize(text string) []uint32 {
	out := make([]uint32, 0, len(text)/2+1)
	for len(text) > 0 {
		i := strings.Index(text, "<|")
		if i < 0 {
			return appendBytes(out, text)
		}
		out = appendBytes(out, text[:i])
		text = text[i:]
		if id, n, ok := readMarker(text); ok {
			out = append(out, id)
			text = text[n:]
			continue
		}
		// "<|" that starts no marker is ordinary text.
		out = appendBytes(out, text[:2])
		text = text[2:]
	}
	return out
}

// readMarker reads a special token or an "<|id_N|>" opaque token at the start of s.
func readMarker(s string) (id uint32, n int, ok bool) {
	end := strings.Index(s[2:], "|>") // s starts with "<|"; the close must come after it
	if end < 0 {
		return 0, 0, false
	}
	end += 2
	m := s[:end+2]
	if id, ok := specialTokens[m]; ok {
		return id, len(m), true
	}
	digits, found := strings.CutPrefix(m[2:end], "id_")
	if !found {
		return 0, 0, false
	}
	v, err := strconv.ParseUint(digits, 10, 32)
	if err != nil || !isOpaque(uint32(v)) || strconv.FormatUint(v, 10) != digits {
		return 0, 0, false
	}
	return uint32(v), len(m), true
}

func isOpaque(id uint32) bool {
	_, special := specialText[id]
	return id >= firstOpaqueID && id < VocabSize && !special
}

func appendBytes(out []uint32, s string) []uint32 {
	for len(s) >= 2 {
		out = append(out, pairBase+uint32(s[0])<<8|uint32(s[1]))
		s = s[2:]
	}
	if len(s) == 1 {
		out = append(out, uint32(s[0]))
	}
	return out
}

// TokenString is the text of one token; ids outside the vocabulary give an error.
func TokenString(id uint32) (string, error) {
	switch {
	case id >= VocabSize:
		return "", fmt.Errorf("token id %d is out of vocabulary (size %d)", id, VocabSize)
	case id < pairBase:
		return string([]byte{byte(id)}), nil
	case id < firstOpaqueID:
		p := id - pairBase
		return string([]byte{byte(p >> 8), byte(p)}), nil
	}
	if s, ok := specialText[id]; ok {
		return s, nil
	}
	return "<|id_" + strconv.FormatUint(uint64(id), 10) + "|>", nil
}

// Detokenize is the inverse of Tokenize: Tokenize(Detokenize(ids)) == ids for every valid id
// list whose byte tokens are not followed by text that re-pairs them (a lone byte token is only
// produced last in a run).
func Detokenize(ids []uint32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		s, err := TokenString(id)
		if err != nil {
			return "", err
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

// checkVocab returns an error naming the first id outside the vocabulary.
func checkVocab(ids []uint32) error {
	for i, id := range ids {
		if id >= VocabSize {
			return fmt.Errorf("token id %d at position %d is out of vocabulary (size %d)", id, i, VocabSize)
		}
	}
	return nil
}

// outputToken is the deterministic i-th generated token of a request: a pair of lowercase
// letters (or a space), so completions read as text and round-trip through the tokenizer.
func outputToken(seed uint64, i int) uint32 {
	x := seed + uint64(i)*0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	a := byte('a' + x%26)
	c := byte('a' + (x>>8)%27)
	if c == 'a'+26 {
		c = ' '
	}
	return pairBase + uint32(a)<<8 | uint32(c)
}
