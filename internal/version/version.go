// Package version says which build of kvroute is running: the version, commit and build date
// the build stamped in (`make build`, the Dockerfiles and hack/images.sh pass them with
// -ldflags -X), else what the Go toolchain recorded from the checkout, and the Go version.
// Every binary prints it for --version; the router and the manager export it as
// kvroute_build_info on /metrics.
package version

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Set at link time, e.g.
//
//	go build -ldflags "-X github.com/kvroute/kvroute/internal/version.version=$(git describe --tags --always --dirty)"
//
// Empty when the build did not stamp them.
var (
	version string
	commit  string
	date    string
)

// Unknown stands for a field neither the link flags nor the toolchain's build info give.
const Unknown = "unknown"

// Info is one build's identity.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	BuildDate string `json:"buildDate"`
	GoVersion string `json:"goVersion"`
}

// Get is this binary's Info: the stamped fields first, then the toolchain's VCS record (a plain
// `go build` in a checkout, or `go install ...@version`), then Unknown.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, date, bi)
}

func resolve(v, c, d string, bi *debug.BuildInfo) Info {
	info := Info{Version: v, Commit: c, BuildDate: d, GoVersion: runtime.Version()}
	if bi != nil {
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if info.Commit == "" {
			info.Commit = settings["vcs.revision"]
		}
		if info.BuildDate == "" {
			// The commit's time: the toolchain records no build time.
			info.BuildDate = settings["vcs.time"]
		}
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			// A module version: a tag, or a pseudo-version the toolchain derived from the
			// checkout (with +dirty for uncommitted changes).
			info.Version = bi.Main.Version
		}
		if info.Version == "" && settings["vcs.revision"] != "" {
			info.Version = short(settings["vcs.revision"])
			if settings["vcs.modified"] == "true" {
				info.Version += "-dirty"
			}
		}
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
	}
	for _, f := range []*string{&info.Version, &info.Commit, &info.BuildDate} {
		if *f == "" {
			*f = Unknown
		}
	}
	return info
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

// String is the one line --version prints after the binary's name.
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, built %s, %s)", i.Version, i.Commit, i.BuildDate, i.GoVersion)
}

// Print writes "NAME VERSION (commit ..., built ..., goX)" and a newline.
func Print(w io.Writer, name string) {
	fmt.Fprintln(w, name, Get().String())
}

// IsFlag reports whether arg is --version or -version (Go's flag package takes both spellings),
// for the binaries whose first argument is a subcommand.
func IsFlag(arg string) bool {
	return arg == "--version" || arg == "-version"
}

// Collector is the gauge kvroute_build_info{version,commit,goversion} = 1, for a registry.
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_build_info",
		Help:        "Always 1; the labels say which kvroute build is running.",
		ConstLabels: prometheus.Labels{"version": i.Version, "commit": i.Commit, "goversion": i.GoVersion}})
	g.Set(1)
	return g
}
