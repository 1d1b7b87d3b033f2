package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvroute/kvroute/router/kvwire"
)

// runDecode prints one KV-event payload (a msgpack KVEventBatch) as normalized JSON.
func runDecode(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	hexIn := fs.String("hex", "", "the payload as hex (whitespace ignored)")
	file := fs.String("file", "", "file holding the raw payload bytes; - reads stdin")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvroutectl decode [--hex HEX | --file F]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvroutectl decode: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kvroutectl decode: %v\n", err)
		return 1
	}
	if (*hexIn == "") == (*file == "") {
		return fail(errors.New("give exactly one of --hex and --file"))
	}
	var payload []byte
	var err error
	switch {
	case *hexIn != "":
		clean := strings.Join(strings.Fields(*hexIn), "")
		if payload, err = hex.DecodeString(clean); err != nil {
			return fail(fmt.Errorf("--hex: %v", err))
		}
	case *file == "-":
		payload, err = io.ReadAll(stdin)
	default:
		payload, err = os.ReadFile(*file)
	}
	if err != nil {
		return fail(err)
	}
	batch, err := kvwire.NewDecoder().DecodeBatch(payload)
	if err != nil {
		return fail(err)
	}
	if err := json.NewEncoder(stdout).Encode(batch); err != nil {
		return fail(err)
	}
	return 0
}
