package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

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
	v, err := validation.New()
	if err != nil {
		fmt.Fprintf(stderr, "kvroutectl render: embedded CRD: %v\n", err)
		return 1
	}
	opts := render.Options{DefaultEngineImage: *engineImage, DefaultRouterImage: *routerImage}
	var out bytes.Buffer
	reader := utilyaml.NewYAMLReader(bufio.NewReader(in))
	docs := 0
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintf(stderr, "kvroutectl render: %s: %v\n", *file, err)
			return 1
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		docs++
		m, err := v.Admit(context.Background(), doc, *namespace)
		if err != nil {
			fmt.Fprintf(stderr, "kvroutectl render: %s: document %d: %v\n", *file, docs, err)
			return 1
		}
		objs, err := render.All(m, opts)
		if err != nil {
			fmt.Fprintf(stderr, "kvroutectl render: %s: %s/%s: %v\n", *file, m.Namespace, m.Name, err)
			return 1
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
	if _, err := stdout.Write(out.Bytes()); err != nil {
		fmt.Fprintf(stderr, "kvroutectl render: %v\n", err)
		return 1
	}
	return 0
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
