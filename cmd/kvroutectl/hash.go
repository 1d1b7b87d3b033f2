package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/router/blockkey"
)

// mmFlags collects repeated --mm ID:OFFSET:LENGTH values.
type mmFlags []blockkey.MMItem

func (m *mmFlags) String() string { return fmt.Sprint(*m) }

// Set splits from the right, so an identifier may itself contain ':' (e.g. "lora:hash").
func (m *mmFlags) Set(v string) error {
	j := strings.LastIndexByte(v, ':')
	i := -1
	if j > 0 {
		i = strings.LastIndexByte(v[:j], ':')
	}
	if i <= 0 {
		return fmt.Errorf("%q: want ID:OFFSET:LENGTH", v)
	}
	off, err1 := strconv.Atoi(v[i+1 : j])
	n, err2 := strconv.Atoi(v[j+1:])
	if err1 != nil || err2 != nil || off < 0 || n <= 0 {
		return fmt.Errorf("%q: OFFSET must be an integer >= 0 and LENGTH > 0", v)
	}
	*m = append(*m, blockkey.MMItem{ID: v[:i], Offset: off, Length: n})
	return nil
}

type hashBlockJSON struct {
	Index     int     `json:"index"`
	HashHex   string  `json:"hash_hex"`
	WireInt   uint64  `json:"wire_int"` // encoding/json writes uint64 digits exactly
	RouterKey *uint64 `json:"router_key,omitempty"`
}

type hashJSON struct {
	Algo        string          `json:"algo"`
	BlockSize   int             `json:"block_size"`
	NoneHashHex string          `json:"none_hash_hex"`
	Blocks      []hashBlockJSON `json:"blocks"`
}

// runHash prints vLLM's block hashes (and optionally kvroute's router keys) for token ids.
func runHash(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hash", flag.ContinueOnError)
	fs.SetOutput(stderr)
	algo := fs.String("algo", "sha256", "vLLM --prefix-caching-hash-algo: sha256, sha256_cbor, xxhash or xxhash_cbor")
	seed := fs.String("seed", "0", "the engines' PYTHONHASHSEED (hashed as a string, as vLLM does)")
	blockSize := fs.Int("block-size", 16, "tokens per block")
	tokensFlag := fs.String("tokens", "", "token ids, comma-separated")
	tokensFile := fs.String("tokens-file", "", "file of token ids (comma, space or newline separated, or a JSON array); - reads stdin")
	lora := fs.String("lora", "", "LoRA adapter name (an extra key on every block)")
	salt := fs.String("cache-salt", "", "cache_salt (an extra key on block 0)")
	var mm mmFlags
	fs.Var(&mm, "mm", "multimodal item ID:OFFSET:LENGTH (repeatable; split from the right)")
	routerKey := fs.Bool("router-key", false, "add kvroute's router key to each block")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvroutectl hash --algo ALGO --seed STR --block-size N --tokens 1,2,3 [--tokens-file F] [--lora NAME] [--cache-salt S] [--mm ID:OFFSET:LENGTH ...] [--router-key]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvroutectl hash: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kvroutectl hash: %v\n", err)
		return 1
	}
	a, err := blockkey.ParseAlgo(*algo)
	if err != nil {
		return fail(err)
	}
	if *blockSize <= 0 {
		return fail(fmt.Errorf("--block-size %d: must be > 0", *blockSize))
	}
	tokens, err := readTokens(*tokensFlag, *tokensFile, stdin)
	if err != nil {
		return fail(err)
	}
	id := blockkey.Identity{LoRAName: *lora, CacheSalt: *salt, MM: mm}
	if err := id.Normalize(); err != nil {
		return fail(err)
	}
	h, err := blockkey.NewEngineHasher(a, *seed)
	if err != nil {
		return fail(err)
	}
	digests, err := h.HashPrompt(tokens, *blockSize, id)
	if err != nil {
		return fail(err)
	}
	var keys []blockkey.Key
	if *routerKey {
		if keys, err = blockkey.AppendPromptKeys(nil, tokens, *blockSize, id); err != nil {
			return fail(err)
		}
	}
	out := hashJSON{Algo: string(a), BlockSize: *blockSize, NoneHashHex: hex.EncodeToString(h.NoneHash()), Blocks: []hashBlockJSON{}}
	for i, d := range digests {
		b := hashBlockJSON{Index: i, HashHex: hex.EncodeToString(d), WireInt: blockkey.WireInt(d)}
		if keys != nil {
			k := uint64(keys[i])
			b.RouterKey = &k
		}
		out.Blocks = append(out.Blocks, b)
	}
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(out); err != nil {
		return fail(err)
	}
	return 0
}

// readTokens takes --tokens or --tokens-file (exactly one).
func readTokens(list, file string, stdin io.Reader) ([]uint32, error) {
	if (list == "") == (file == "") {
		return nil, errors.New("give exactly one of --tokens and --tokens-file")
	}
	text := list
	if file != "" {
		var raw []byte
		var err error
		if file == "-" {
			raw, err = io.ReadAll(stdin)
		} else {
			raw, err = os.ReadFile(file)
		}
		if err != nil {
			return nil, err
		}
		text = string(raw)
	}
	text = strings.TrimSpace(text)
	text = strings.TrimSuffix(strings.TrimPrefix(text, "["), "]")
	fields := strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' })
	tokens := make([]uint32, 0, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token %d %q: not a token id (an integer 0..4294967295)", i, f)
		}
		tokens = append(tokens, uint32(v))
	}
	return tokens, nil
}
