package olmbundle

import (
	"strings"
	"testing"
)

const base = `apiVersion: operators.coreos.com/v1alpha1
kind: ClusterServiceVersion
metadata: {name: x}
spec: {install: {strategy: deployment}}
`
const dep = `---
apiVersion: apps/v1
kind: Deployment
metadata: {name: m, namespace: ns, labels: {a: b}}
spec:
  template:
    spec:
      serviceAccountName: sa
      containers:
      - name: manager
        image: img:1
        args: [--default-router-image=r:1, --default-engine-image=e:1]
`
const rbac = `---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cr}
rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: crb}
roleRef: {kind: ClusterRole, name: cr}
subjects: [{kind: ServiceAccount, name: sa, namespace: ns}]
`
const sample = `---
apiVersion: serving.kvroute.io/v1alpha1
kind: KVRoutedModel
metadata: {name: s, namespace: llm}
spec: {model: {name: a, uri: hf://a/b}}
`

var opts = Options{Version: "1.2.3", CreatedAt: "2026-01-01T00:00:00Z", Icon: []byte("<svg/>")}

func TestGenerateFoldsInstallIntoCSV(t *testing.T) {
	files, err := Generate([]byte(base+dep+rbac+sample), opts)
	if err != nil {
		t.Fatal(err)
	}
	csv := string(files["manifests/kvroute.clusterserviceversion.yaml"])
	for _, want := range []string{"name: kvroute.v1.2.3", "version: 1.2.3", "serviceAccountName: sa", "containerImage: img:1",
		"image: r:1", "image: e:1", `"name": "s"`, "mediatype: image/svg+xml"} {
		if !strings.Contains(csv, want) {
			t.Errorf("CSV lacks %q:\n%s", want, csv)
		}
	}
	if strings.Contains(csv, `"namespace": "llm"`) {
		t.Error("alm-examples keep the sample's namespace")
	}
	if _, ok := files["metadata/annotations.yaml"]; !ok {
		t.Error("no metadata/annotations.yaml")
	}
}

func TestGenerateRejectsBadInput(t *testing.T) {
	for name, tc := range map[string]struct {
		in   string
		opts Options
		want string
	}{
		"no CSV":          {dep + rbac + sample, opts, "no base ClusterServiceVersion"},
		"no Deployment":   {base + rbac + sample, opts, "no Deployment"},
		"no samples":      {base + dep + rbac, opts, "no KVRoutedModel samples"},
		"no binding":      {base + dep + sample, opts, "no ClusterRoleBinding"},
		"dangling role":   {base + dep + strings.Replace(rbac, "name: cr}", "name: other}", 1) + sample, opts, "not in the rendering"},
		"unknown kind":    {base + dep + rbac + sample + "---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\n", opts, "no place"},
		"v-prefixed":      {base + dep + rbac + sample, Options{Version: "v1.0.0", Icon: opts.Icon}, "without a leading v"},
		"no icon":         {base + dep + rbac + sample, Options{Version: "1.0.0"}, "no icon"},
		"not YAML":        {"{[", opts, "decode"},
		"object no kind":  {"a: b\n", opts, "without kind"},
		"manager missing": {base + strings.Replace(dep, "name: manager", "name: other", 1) + rbac + sample, opts, "no container named manager"},
	} {
		_, err := Generate([]byte(tc.in), tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}
