// Command bundlegen writes the OLM bundle from a rendering of config/manifests; hack/bundle.sh
// runs it (`make bundle`).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvroute/kvroute/test/ship/olmbundle"
)

func main() {
	rendered := flag.String("rendered", "", "output of kustomize build config/manifests")
	icon := flag.String("icon", "config/manifests/icon.svg", "SVG icon")
	version := flag.String("version", "", "bundle version, e.g. 0.1.0")
	out := flag.String("out", "bundle", "bundle directory")
	flag.Parse()
	if err := run(*rendered, *icon, *version, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bundlegen:", err)
		os.Exit(1)
	}
}

func run(rendered, icon, version, out string) error {
	in, err := os.ReadFile(rendered)
	if err != nil {
		return err
	}
	svg, err := os.ReadFile(icon)
	if err != nil {
		return err
	}
	files, err := olmbundle.Generate(in, olmbundle.Options{
		Version:   version,
		CreatedAt: time.Now().UTC().Format(time.RFC3339),
		Icon:      svg,
	})
	if err != nil {
		return err
	}
	return olmbundle.Write(out, files)
}
