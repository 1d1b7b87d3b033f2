package ship

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/controllers/render"
)

// docs/install.md's table of tested vLLM releases is render.TestedVLLMReleases, row for row, and
// every shipped default engine image is the newest of them.
func TestTestedVLLMTableIsCurrent(t *testing.T) {
	doc := string(readFile(t, "docs/install.md"))
	begin := strings.Index(doc, "<!-- tested-vllm:")
	end := strings.Index(doc, "<!-- /tested-vllm -->")
	if begin < 0 || end < begin {
		t.Fatal("docs/install.md lacks the <!-- tested-vllm --> table")
	}
	var rows []string
	for _, l := range strings.Split(doc[begin:end], "\n") {
		if strings.HasPrefix(l, "| `") {
			rows = append(rows, l)
		}
	}
	var want []string
	for _, r := range render.TestedVLLMReleases {
		want = append(want, fmt.Sprintf("| `%s:%s` | %s | %s | %s |", render.VLLMImage, r.Tag, r.EventShape, r.Replay, r.Evidence))
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("docs/install.md tested-vllm rows:\n%s\nwant (controllers/render/vllm.go):\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	for _, r := range render.TestedVLLMReleases {
		if r.Tag == "" || r.Tag == "latest" {
			t.Errorf("tested release %q", r.Tag)
		}
	}
	flag := "--default-engine-image=" + render.DefaultEngineImage
	for _, f := range []string{"config/manager/manager.yaml", "dist/install.yaml", "bundle/manifests/kvroute.clusterserviceversion.yaml"} {
		if !strings.Contains(string(readFile(t, f)), flag) {
			t.Errorf("%s does not pass %s", f, flag)
		}
	}
}
