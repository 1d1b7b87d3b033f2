// Package release keeps what a release publishes and what it installs in step, without a
// control plane: the release workflow (.github/workflows/release.yml), dist/install.yaml, the
// OLM bundle's CSV, the Makefile's VERSION and the manager's compiled-in defaults
// (controllers/render). A tag vX.Y.Z must publish exactly the images dist/install.yaml vX.Y.Z
// and the CSV name. The workflow runs it with RELEASE_TAG set to the pushed tag.
package release

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/controllers/render"
	"github.com/kvroute/kvroute/test/envtestenv"
)

const imageRepo = "ghcr.io/kvroute"

func read(t *testing.T, rel string) string {
	t.Helper()
	root, err := envtestenv.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReleaseTagIsTheVersion(t *testing.T) {
	tag := os.Getenv("RELEASE_TAG")
	if tag == "" {
		t.Skip("RELEASE_TAG is set by the release workflow")
	}
	if tag != render.Version {
		t.Fatalf("tag %s, but the manifests and controllers/render.Version are %s: bump them (make build-installer bundle) first", tag, render.Version)
	}
}

func TestVersionsAgree(t *testing.T) {
	v := render.Version
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(v) {
		t.Fatalf("render.Version %q is not vX.Y.Z", v)
	}
	if m := regexp.MustCompile(`(?m)^VERSION\s*\?=\s*(\S+)`).FindStringSubmatch(read(t, "Makefile")); m == nil || "v"+m[1] != v {
		t.Errorf("Makefile VERSION %v, want %s", m, strings.TrimPrefix(v, "v"))
	}
	if m := regexp.MustCompile(`(?m)^IMAGE_REPO\s*\?=\s*(\S+)`).FindStringSubmatch(read(t, "Makefile")); m == nil || m[1] != imageRepo {
		t.Errorf("Makefile IMAGE_REPO %v, want %s", m, imageRepo)
	}
	if want := imageRepo + "/kvrouter:" + v; render.DefaultRouterImage != want {
		t.Errorf("compiled-in --default-router-image %s, want %s", render.DefaultRouterImage, want)
	}
	for _, d := range []string{render.DefaultRouterImage, render.DefaultEngineImage} {
		if strings.HasSuffix(d, ":latest") || !strings.Contains(d, ":") {
			t.Errorf("compiled-in default %s is not pinned", d)
		}
	}

	install := read(t, "dist/install.yaml")
	for _, want := range []string{
		"image: " + imageRepo + "/manager:" + v,
		"--default-router-image=" + imageRepo + "/kvrouter:" + v,
		"--default-engine-image=" + render.DefaultEngineImage,
	} {
		if !strings.Contains(install, want) {
			t.Errorf("dist/install.yaml lacks %q", want)
		}
	}
	var images []string
	for _, m := range regexp.MustCompile(`(?m)(?:image: |-image=)(\S+)`).FindAllStringSubmatch(install, -1) {
		images = append(images, m[1])
	}
	for _, img := range images {
		if strings.HasSuffix(img, ":latest") || !strings.Contains(img, ":") {
			t.Errorf("dist/install.yaml uses unpinned image %s", img)
		}
	}

	var csv struct {
		Metadata struct {
			Name        string            `json:"name"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Version       string `json:"version"`
			RelatedImages []struct {
				Name  string `json:"name"`
				Image string `json:"image"`
			} `json:"relatedImages"`
		} `json:"spec"`
	}
	csvText := read(t, "bundle/manifests/kvroute.clusterserviceversion.yaml")
	if err := yaml.Unmarshal([]byte(csvText), &csv); err != nil {
		t.Fatal(err)
	}
	if csv.Metadata.Name != "kvroute."+v || "v"+csv.Spec.Version != v {
		t.Errorf("CSV %s version %s, want kvroute.%s", csv.Metadata.Name, csv.Spec.Version, v)
	}
	if got := csv.Metadata.Annotations["containerImage"]; got != imageRepo+"/manager:"+v {
		t.Errorf("CSV containerImage %s", got)
	}
	related := map[string]string{}
	for _, r := range csv.Spec.RelatedImages {
		related[r.Name] = r.Image
	}
	for name, want := range map[string]string{"manager": imageRepo + "/manager:" + v, "kvrouter": imageRepo + "/kvrouter:" + v, "vllm": render.DefaultEngineImage} {
		if related[name] != want {
			t.Errorf("CSV relatedImages %s=%s, want %s", name, related[name], want)
		}
	}
	if !strings.Contains(csvText, "--default-router-image="+imageRepo+"/kvrouter:"+v) {
		t.Errorf("the CSV's deployment does not pass --default-router-image=%s/kvrouter:%s", imageRepo, v)
	}
	if strings.Contains(csvText, ":latest") {
		t.Error("the CSV names a :latest image")
	}
	if !strings.Contains(read(t, "docs/install.md"), "kvroute-bundle:"+v) {
		t.Errorf("docs/install.md does not name the bundle image kvroute-bundle:%s", v)
	}
}

// The workflow publishes, on a v* tag, for amd64 and arm64 built in Debian bookworm (the
// Dockerfiles' release), the four images under the repository and tag the manifests name.
func TestReleaseWorkflowPublishesWhatIsInstalled(t *testing.T) {
	text := read(t, ".github/workflows/release.yml")
	var wf struct {
		On struct {
			Push struct {
				Tags []string `json:"tags"`
			} `json:"push"`
		} `json:"on"`
		Env  map[string]string `json:"env"`
		Jobs map[string]struct {
			Needs     any `json:"needs"`
			Container any `json:"container"`
			Strategy  struct {
				Matrix struct {
					Include []map[string]string `json:"include"`
				} `json:"matrix"`
			} `json:"strategy"`
			Steps []struct {
				Run  string            `json:"run"`
				Uses string            `json:"uses"`
				Env  map[string]string `json:"env"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	if err := yaml.Unmarshal([]byte(text), &wf); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(wf.On.Push.Tags, []string{"v*"}) {
		t.Errorf("trigger tags %v, want [v*]", wf.On.Push.Tags)
	}
	if wf.Env["IMAGE_REPO"] != imageRepo {
		t.Errorf("IMAGE_REPO %q, want %s", wf.Env["IMAGE_REPO"], imageRepo)
	}
	if !strings.Contains(wf.Env["CRANE"], "go-containerregistry/cmd/crane@v") {
		t.Errorf("crane not pinned: %q", wf.Env["CRANE"])
	}
	build, ok := wf.Jobs["images"]
	if !ok {
		t.Fatal("no images job")
	}
	var arches []string
	for _, inc := range build.Strategy.Matrix.Include {
		arches = append(arches, inc["arch"])
	}
	slices.Sort(arches)
	if !slices.Equal(arches, []string{"amd64", "arm64"}) {
		t.Errorf("matrix arches %v", arches)
	}
	// Same Debian release as the Dockerfiles' final stages.
	df := read(t, "Dockerfile.kvrouter")
	if build.Container != "debian:bookworm" || !strings.Contains(df, "debian:bookworm-slim") {
		t.Errorf("images job container %v; Dockerfile.kvrouter's runtime is bookworm", build.Container)
	}
	var runs []string
	for _, s := range build.Steps {
		runs = append(runs, s.Run)
	}
	all := strings.Join(runs, "\n")
	for _, want := range []string{
		`RELEASE_TAG="${GITHUB_REF_NAME}" go test -count=1 ./test/release/`,
		`make images VERSION="${GITHUB_REF_NAME#v}" IMAGE_REPO="${IMAGE_REPO}"`,
		`KVROUTE_IMAGES_DIR=bin/images`,
		`for tarball in manager kvrouter vllm-sim bundle; do`,
		`[ "$tarball" = bundle ] && repo=kvroute-bundle`,
		`push "bin/images/$tarball.tar" "$IMAGE_REPO/$repo:${GITHUB_REF_NAME}-$ARCH"`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("images job does not run %q", want)
		}
	}
	// The step order: check the tag, build, test, push.
	idx := func(s string) int { return strings.Index(all, s) }
	order := []int{idx("./test/release/"), idx("make images"), idx("./test/images/"), idx(`"$CRANE" push`)}
	if order[0] < 0 || !slices.IsSorted(order) {
		t.Errorf("images job does not check the tag, build, test and then push, in that order (%v)", order)
	}
	man, ok := wf.Jobs["manifest"]
	if !ok || man.Needs != "images" {
		t.Fatal("no manifest job after the images job")
	}
	var mruns []string
	for _, s := range man.Steps {
		mruns = append(mruns, s.Run)
	}
	mall := strings.Join(mruns, "\n")
	for _, want := range []string{
		`for repo in manager kvrouter vllm-sim kvroute-bundle; do`,
		`ref="$IMAGE_REPO/$repo:${GITHUB_REF_NAME}"`,
		`index append -m "$ref-amd64" -m "$ref-arm64" -t "$ref"`,
	} {
		if !strings.Contains(mall, want) {
			t.Errorf("manifest job does not run %q", want)
		}
	}
	// What the workflow publishes for tag render.Version is what the manifests run.
	install := read(t, "dist/install.yaml")
	for _, repo := range []string{"manager", "kvrouter"} {
		if !strings.Contains(install, imageRepo+"/"+repo+":"+render.Version) {
			t.Errorf("dist/install.yaml does not name %s/%s:%s, which the workflow publishes", imageRepo, repo, render.Version)
		}
	}
	// hack/images.sh tags the bundle image kvroute-bundle, as bundle.Dockerfile's comment does.
	if !strings.Contains(read(t, "hack/images.sh"), "tag=$IMAGE_REPO/kvroute-bundle:$VERSION") {
		t.Error("hack/images.sh does not tag the bundle image kvroute-bundle")
	}
}
