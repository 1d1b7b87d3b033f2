package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"

	"github.com/kvroute/kvroute/api/v1alpha1/validation"
	"github.com/kvroute/kvroute/controllers/render"
)

// runRender admits every KVRoutedModel in the file with the CRD's own defaults and rules
// (as the API server would) and prints the children the operator would apply.
func runRender(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "KVRoutedModel YAML file (one or more documents); - reads stdin")
	namespace := fs.String("n", "default", "namespace for resources that name none")
	engineImage := fs.String("engine-image", render.DefaultEngineImage, "engine image when spec.engine.image is empty (the operator's --default-engine-image)")
	routerImage := fs.String("router-image", render.DefaultRouterImage, "router image when spec.router.image is empty (the operator's --default-router-image)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: kvroutectl render -f FILE [-n NAMESPACE] [--engine-image IMG] [--router-image IMG]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	var in io.Reader = stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			fmt.Fprintf(stderr, "kvroutectl render: %v\n", err)
			return 1
		}
		defer f.Close()
		in = f
	}
	input, err := io.ReadAll(in)
	if err != nil {
		fmt.Fprintf(stderr, "kvroutectl render: %s: %v\n", *file, err)
		return 1
	}
	v, err := validation.New()
	if err != nil {
		fmt.Fprintf(stderr, "kvroutectl render: embedded CRD: %v\n", err)
		return 1
	}
	opts := render.Options{DefaultEngineImage: *engineImage, DefaultRouterImage: *routerImage}
	// Every document is checked, so one run names every bad one (file:line of its first
	// line), not only the first; nothing is printed unless all of them render.
	var out bytes.Buffer
	docs, bad := 0, 0
	for _, d := range splitDocuments(input) {
		if len(bytes.TrimSpace(stripComments(d.body))) == 0 {
			continue
		}
		docs++
		where := fmt.Sprintf("%s:%d: document %d", *file, d.line, docs)
		m, err := v.Admit(context.Background(), d.body, *namespace)
		if err != nil {
			fmt.Fprintf(stderr, "kvroutectl render: %s: %s\n", where, fileLines(err.Error(), d.line))
			bad++
			continue
		}
		objs, err := render.All(m, opts)
		if err != nil {
			fmt.Fprintf(stderr, "kvroutectl render: %s (%s/%s): %v\n", where, m.Namespace, m.Name, err)
			bad++
			continue
		}
		args := make([]string, len(m.Spec.Engine.Args))
		for i, a := range m.Spec.Engine.Args {
			args[i] = string(a)
		}
		for _, w := range render.CheckEngineArgsFor(render.EngineKind(m), args) {
			fmt.Fprintf(stderr, "kvroutectl render: %s (%s/%s): warning: %s\n", where, m.Namespace, m.Name, w)
		}
		b, err := render.YAML(objs)
		if err != nil {
			fmt.Fprintf(stderr, "kvroutectl render: %v\n", err)
			return 1
		}
		out.Write(b)
	}
	if docs == 0 {
		fmt.Fprintf(stderr, "kvroutectl render: %s: no KVRoutedModel documents\n", *file)
		return 1
	}
	if bad > 0 {
		fmt.Fprintf(stderr, "kvroutectl render: %s: %d of %d documents refused\n", *file, bad, docs)
		return 1
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		fmt.Fprintf(stderr, "kvroutectl render: %v\n", err)
		return 1
	}
	return 0
}

// document is one YAML document of the input and the file line it starts on.
type document struct {
	body []byte
	line int
}

// splitDocuments splits a YAML stream at its "---" lines (a separator may carry a comment),
// keeping each document's first line number for messages.
func splitDocuments(in []byte) []document {
	var out []document
	cur, start := []byte{}, 1
	lines := bytes.SplitAfter(in, []byte("\n"))
	for i, line := range lines {
		if rest, ok := bytes.CutPrefix(line, []byte("---")); ok {
			if t := bytes.TrimSpace(rest); len(t) == 0 || t[0] == '#' {
				out = append(out, document{body: cur, line: start})
				cur, start = []byte{}, i+2
				continue
			}
		}
		cur = append(cur, line...)
	}
	return append(out, document{body: cur, line: start})
}

var yamlLine = regexp.MustCompile(`\bline (\d+)\b`)

// fileLines rewrites the "line N" of a YAML decoding error, counted from the document's
// start, as the file's line.
func fileLines(msg string, first int) string {
	return yamlLine.ReplaceAllStringFunc(msg, func(s string) string {
		n, err := strconv.Atoi(s[len("line "):])
		if err != nil {
			return s
		}
		return "line " + strconv.Itoa(n+first-1)
	})
}

// stripComments drops whole-line YAML comments so a comment-only document counts as empty.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
