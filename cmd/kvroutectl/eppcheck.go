package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/router/extproc/gatewaytest"
)

// runEPPCheck plays the gateway in front of an endpoint picker (any picker of the Gateway API
// Inference Extension's protocol) and reports each check: exit 0 when all pass, 1 otherwise.
func runEPPCheck(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("epp-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "the model name the engines behind the picker serve (required)")
	conformance := fs.Bool("conformance", false, "also check the conformance suite's hooks (test-epp-endpoint-selection, x-conformance-test-served-endpoint)")
	useTLS := fs.Bool("tls", false, "dial the picker over TLS without verifying its certificate, as gateways dial the Inference Extension's picker (its self-signed one included)")
	timeout := fs.Duration("timeout", time.Minute, "time limit of each check")
	output := fs.String("output", "table", "table or json")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvroutectl epp-check ADDR --model NAME [--conformance] [--tls] [--timeout 1m] [--output table|json]")
		fs.PrintDefaults()
	}
	// The address comes first; flags may follow it.
	var addr string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		addr, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if addr == "" && fs.NArg() == 1 {
		addr = fs.Arg(0)
	} else if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvroutectl epp-check: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if addr == "" || *model == "" || (*output != "table" && *output != "json") {
		fs.Usage()
		return 2
	}
	co := gatewaytest.CheckOptions{Model: *model, Conformance: *conformance, Timeout: *timeout}
	if *useTLS {
		co.TLS = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // what a gateway does with a picker's self-signed certificate
	}
	res, err := gatewaytest.Check(context.Background(), addr, co)
	if err != nil {
		fmt.Fprintf(stderr, "kvroutectl epp-check: %v\n", err)
		return 1
	}
	failed := 0
	for _, o := range res {
		if !o.Pass {
			failed++
		}
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, o := range res {
			verdict := "PASS"
			switch {
			case o.Skipped:
				verdict = "SKIP"
			case !o.Pass:
				verdict = "FAIL"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", verdict, o.Name, o.Detail)
		}
		_ = tw.Flush()
		fmt.Fprintf(stdout, "%d checks, %d failed\n", len(res), failed)
	}
	if failed > 0 {
		return 1
	}
	return 0
}
