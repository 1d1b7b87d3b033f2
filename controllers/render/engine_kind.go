package render

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// engineServer renders one engine kind's server process (spec.engine.kind): its command line,
// the variables it needs, its HTTP paths, its image and its option list. Everything else in
// the engine pod (ports per DP rank, volumes, security, resources) is the same for every kind.
// Each implementation is a pure function of the model.
type engineServer interface {
	// command is the container's command; args come after it.
	command() []string
	// args are the container's args: the operator's flags, then spec.engine.args.
	args(m *v1alpha1.KVRoutedModel) ([]string, error)
	// env is what this engine needs beyond engineEnv's variables, in order after them.
	env(m *v1alpha1.KVRoutedModel) ([]corev1.EnvVar, error)
	// configFile is a file the server reads at start, nil for none.
	configFile(m *v1alpha1.KVRoutedModel) (*engineConfigFile, error)
	// healthPath answers 200 once the server takes requests; metricsPath serves Prometheus text.
	healthPath() string
	metricsPath() string
	// releases are the images this kind is tested with, newest (the default) first.
	releases() engineReleases
	// flags are the options of the pinned release's server, for CheckEngineArgs.
	flags() *flagTable
}

// engineConfigFile is a config file an engine reads at start. Its content goes in the pod
// annotation AnnotationEngineConfig, and a downward API volume mounted read-only at Dir makes
// it the file Name: the kubelet writes it, so the container needs no shell to, and a change
// to it changes the pod template (a rollout, as a change to the args).
type engineConfigFile struct {
	Dir, Name, Content string
}

// engineConfigVolume is the downward API volume that holds an engineConfigFile.
const engineConfigVolume = "engine-config"

// engineReleases are one kind's pinned images.
type engineReleases struct {
	// Engine names the engine in messages ("vLLM").
	Engine string
	// Repo is the image repository the tags belong to.
	Repo string
	// Tags are the tested tags, newest first; the first is the default image.
	Tags []string
}

// defaultImage is the newest tested release.
func (r engineReleases) defaultImage() string { return r.Repo + ":" + r.Tags[0] }

// servers are the engine kinds by spec.engine.kind.
var servers = map[string]engineServer{
	v1alpha1.EngineVLLM:   vllmServer{},
	v1alpha1.EngineSGLang: sglangServer{},
	v1alpha1.EngineTRTLLM: trtllmServer{},
}

// EngineKind is the model's spec.engine.kind; a model stored before the field existed reads
// as vllm.
func EngineKind(m *v1alpha1.KVRoutedModel) string {
	if m.Spec.Engine.Kind == "" {
		return v1alpha1.EngineVLLM
	}
	return m.Spec.Engine.Kind
}

// serverFor returns the renderer of the model's engine kind.
func serverFor(m *v1alpha1.KVRoutedModel) (engineServer, error) {
	kind := EngineKind(m)
	s, ok := servers[kind]
	if !ok {
		return nil, fmt.Errorf("spec.engine.kind %q: want vllm, sglang or trtllm", kind)
	}
	return s, nil
}

// EngineKinds lists the kinds the operator renders, in a fixed order.
func EngineKinds() []string {
	return []string{v1alpha1.EngineVLLM, v1alpha1.EngineSGLang, v1alpha1.EngineTRTLLM}
}

// DefaultImageFor is the image a model of kind runs when spec.engine.image is empty: the
// operator's --default-engine-image (defaultVLLM) for vllm, the pinned release otherwise.
func DefaultImageFor(kind, defaultVLLM string) string {
	if kind == v1alpha1.EngineVLLM || kind == "" {
		return defaultVLLM
	}
	if s, ok := servers[kind]; ok {
		return s.releases().defaultImage()
	}
	return ""
}

// EngineMetricsPath is where the model's engines serve Prometheus metrics.
func EngineMetricsPath(m *v1alpha1.KVRoutedModel) string {
	if s, err := serverFor(m); err == nil {
		return s.metricsPath()
	}
	return "/metrics"
}

// engineImage is the image the engine container runs.
func engineImage(m *v1alpha1.KVRoutedModel, opts Options) (string, error) {
	if m.Spec.Engine.Image != "" {
		return m.Spec.Engine.Image, nil
	}
	image := DefaultImageFor(EngineKind(m), opts.DefaultEngineImage)
	if image == "" {
		return "", fmt.Errorf("spec.engine.image is empty and the operator has no --default-engine-image")
	}
	return image, nil
}

// EngineImageTestedFor reports whether image is a tested release of kind (any registry host in
// front of the repository), or kvroute's vllm-sim, which speaks every kind. It returns the tag
// it found, "" for an image with no tag (or only a digest, which cannot be mapped to a release).
func EngineImageTestedFor(kind, image string) (tested bool, tag string) {
	name, _, _ := strings.Cut(image, "@")
	repo, t := name, ""
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		repo, t = name[:i], name[i+1:]
	}
	for _, s := range simImages {
		if repo == s || strings.HasSuffix(repo, "/"+s) {
			return true, t
		}
	}
	s, ok := servers[kind]
	if kind == "" {
		s, ok = servers[v1alpha1.EngineVLLM], true
	}
	if !ok {
		return false, t
	}
	rel := s.releases()
	if repo != rel.Repo && !strings.HasSuffix(repo, "/"+rel.Repo) {
		return false, t
	}
	for _, r := range rel.Tags {
		if t != "" && t == r {
			return true, t
		}
	}
	return false, t
}

// TestedReleases describes kind's tested images for messages: "vLLM (vllm/vllm-openai:v0.26.0)".
func TestedReleases(kind string) string {
	s, ok := servers[kind]
	if !ok {
		return ""
	}
	rel := s.releases()
	return rel.Engine + " (" + rel.Repo + ":" + strings.Join(rel.Tags, ", ") + ")"
}

// EngineKindRow is one engine kind as docs/install.md's table of engine kinds shows it.
type EngineKindRow struct {
	Kind, Server, Image, Health, Metrics string
}

// EngineKindRows are the rows of docs/install.md's engine-kinds table, in EngineKinds order;
// a test keeps the table equal to them. Image is the default of the kind (vLLM's is the
// operator's shipped --default-engine-image).
func EngineKindRows() []EngineKindRow {
	var rows []EngineKindRow
	for _, k := range EngineKinds() {
		s := servers[k]
		rows = append(rows, EngineKindRow{Kind: k, Server: s.flags().of,
			Image: DefaultImageFor(k, DefaultEngineImage), Health: s.healthPath(), Metrics: s.metricsPath()})
	}
	return rows
}

// String is the row as the table writes it.
func (r EngineKindRow) String() string {
	return fmt.Sprintf("| `%s` | %s | `%s` | `%s` | `%s` |", r.Kind, r.Server, r.Image, r.Health, r.Metrics)
}
