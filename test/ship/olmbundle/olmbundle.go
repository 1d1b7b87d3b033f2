// Package olmbundle writes kvroute's OLM registry+v1 bundle from the rendering of
// config/manifests: the hand-written base CSV, the install (config/default) and the samples.
//
// operator-sdk, which normally does this (`generate bundle`), is not available from the module
// proxy, so this is the small part of it kvroute needs, written by hand: the Deployment,
// ClusterRole and Role become the CSV's install strategy, the samples become alm-examples, the
// CRD and the metrics Service are copied, and metadata/annotations.yaml and the scorecard
// configuration are written. The objects OLM creates itself (Namespace, ServiceAccount, RBAC
// bindings) are dropped.
package olmbundle

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Package is the OLM package name; Channel its only channel.
const (
	Package = "kvroute"
	Channel = "alpha"
	// ScorecardImage runs the scorecard tests (operator-sdk's, in a cluster; not here).
	ScorecardImage = "quay.io/operator-framework/scorecard-test:v1.42.3"
)

// Options are the inputs that are not in the rendering.
type Options struct {
	// Version is the bundle's semantic version without a leading v, e.g. 0.1.0.
	Version string
	// CreatedAt goes into the CSV's createdAt annotation (RFC 3339).
	CreatedAt string
	// Icon is the SVG icon.
	Icon []byte
}

// Annotations are metadata/annotations.yaml's keys; bundle.Dockerfile carries the same as LABELs.
func Annotations() map[string]string {
	return map[string]string{
		"operators.operatorframework.io.bundle.mediatype.v1":       "registry+v1",
		"operators.operatorframework.io.bundle.manifests.v1":       "manifests/",
		"operators.operatorframework.io.bundle.metadata.v1":        "metadata/",
		"operators.operatorframework.io.bundle.package.v1":         Package,
		"operators.operatorframework.io.bundle.channels.v1":        Channel,
		"operators.operatorframework.io.bundle.channel.default.v1": Channel,
		"operators.operatorframework.io.test.mediatype.v1":         "scorecard+v1",
		"operators.operatorframework.io.test.config.v1":            "tests/scorecard/",
	}
}

// Generate returns the bundle's files, keyed by their path relative to the bundle directory.
func Generate(rendered []byte, o Options) (map[string][]byte, error) {
	if o.Version == "" || strings.HasPrefix(o.Version, "v") {
		return nil, fmt.Errorf("olmbundle: version %q must be a semantic version without a leading v", o.Version)
	}
	if len(o.Icon) == 0 {
		return nil, errors.New("olmbundle: no icon")
	}
	objs, err := decodeAll(rendered)
	if err != nil {
		return nil, err
	}
	r, err := sortRendering(objs)
	if err != nil {
		return nil, err
	}
	csv, files, relatedImages := r.csv, r.files, map[string]string{}

	var strategyDeployments []any
	for _, d := range r.deployments {
		spec, _, _ := unstructured.NestedMap(d.Object, "spec")
		if spec == nil {
			return nil, fmt.Errorf("olmbundle: Deployment %s has no spec", d.GetName())
		}
		labels := map[string]any{}
		for k, v := range d.GetLabels() {
			labels[k] = v
		}
		strategyDeployments = append(strategyDeployments, map[string]any{"name": d.GetName(), "label": labels, "spec": spec})
		if err := collectImages(d, relatedImages); err != nil {
			return nil, err
		}
	}
	clusterPerms, perms, err := permissions(r.roles, r.bindings)
	if err != nil {
		return nil, err
	}

	almExamples, err := json.MarshalIndent(r.examples, "", "  ")
	if err != nil {
		return nil, err
	}
	csv = csv.DeepCopy()
	csv.SetName(Package + ".v" + o.Version)
	csv.SetNamespace("placeholder")
	ann := csv.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann["alm-examples"] = string(almExamples)
	ann["createdAt"] = o.CreatedAt
	ann["containerImage"] = relatedImages["manager"]
	csv.SetAnnotations(ann)
	csv.SetLabels(nil)
	set := func(v any, path ...string) error { return unstructured.SetNestedField(csv.Object, v, path...) }
	if err := set(o.Version, "spec", "version"); err != nil {
		return nil, err
	}
	if err := set([]any{map[string]any{"base64data": base64.StdEncoding.EncodeToString(o.Icon), "mediatype": "image/svg+xml"}}, "spec", "icon"); err != nil {
		return nil, err
	}
	if err := set(map[string]any{"deployments": strategyDeployments, "clusterPermissions": clusterPerms, "permissions": perms}, "spec", "install", "spec"); err != nil {
		return nil, err
	}
	var related []any
	for _, name := range sortedKeys(relatedImages) {
		related = append(related, map[string]any{"name": name, "image": relatedImages[name]})
	}
	if err := set(related, "spec", "relatedImages"); err != nil {
		return nil, err
	}
	b, err := yaml.Marshal(csv.Object)
	if err != nil {
		return nil, err
	}
	files["manifests/"+Package+".clusterserviceversion.yaml"] = b

	annotations := map[string]any{}
	for k, v := range Annotations() {
		annotations[k] = v
	}
	if files["metadata/annotations.yaml"], err = yaml.Marshal(map[string]any{"annotations": annotations}); err != nil {
		return nil, err
	}
	if files["tests/scorecard/config.yaml"], err = yaml.Marshal(scorecardConfig()); err != nil {
		return nil, err
	}
	return files, nil
}

// rendering is the kustomize output sorted by where each object goes in the bundle.
type rendering struct {
	csv         *unstructured.Unstructured
	deployments []*unstructured.Unstructured
	roles       map[string]*unstructured.Unstructured // kind/name -> role
	bindings    []*unstructured.Unstructured
	examples    []any
	files       map[string][]byte // manifests copied as they are (CRDs, Services, ConfigMaps)
}

// sortRendering sorts the rendered objects, refusing one a registry+v1 bundle has no place for
// and a rendering without a base CSV, a Deployment or a sample.
func sortRendering(objs []*unstructured.Unstructured) (*rendering, error) {
	r := &rendering{roles: map[string]*unstructured.Unstructured{}, files: map[string][]byte{}}
	for _, u := range objs {
		switch u.GetKind() {
		case "ClusterServiceVersion":
			if r.csv != nil {
				return nil, errors.New("olmbundle: more than one ClusterServiceVersion in the rendering")
			}
			r.csv = u
		case "Deployment":
			r.deployments = append(r.deployments, u)
		case "ClusterRole", "Role":
			r.roles[u.GetKind()+"/"+u.GetName()] = u
		case "ClusterRoleBinding", "RoleBinding":
			r.bindings = append(r.bindings, u)
		case "KVRoutedModel":
			ex := u.DeepCopy()
			// alm-examples are created in whatever namespace the user picks.
			ex.SetNamespace("")
			r.examples = append(r.examples, ex.Object)
		case "Namespace", "ServiceAccount":
			// OLM creates the install namespace and the ServiceAccounts named in the CSV.
		case "CustomResourceDefinition":
			b, err := yaml.Marshal(u.Object)
			if err != nil {
				return nil, err
			}
			group, _, _ := unstructured.NestedString(u.Object, "spec", "group")
			plural, _, _ := unstructured.NestedString(u.Object, "spec", "names", "plural")
			r.files["manifests/"+group+"_"+plural+".yaml"] = b
		case "Service", "ConfigMap":
			u = u.DeepCopy()
			u.SetNamespace("")
			b, err := yaml.Marshal(u.Object)
			if err != nil {
				return nil, err
			}
			r.files[fmt.Sprintf("manifests/%s_%s_%s.yaml", u.GetName(), u.GroupVersionKind().Version, strings.ToLower(u.GetKind()))] = b
		default:
			return nil, fmt.Errorf("olmbundle: %s %s has no place in a registry+v1 bundle", u.GetKind(), u.GetName())
		}
	}
	if r.csv == nil {
		return nil, errors.New("olmbundle: no base ClusterServiceVersion in the rendering")
	}
	if len(r.deployments) == 0 {
		return nil, errors.New("olmbundle: no Deployment in the rendering")
	}
	if len(r.examples) == 0 {
		return nil, errors.New("olmbundle: no KVRoutedModel samples for alm-examples")
	}
	return r, nil
}

// Write replaces dir's manifests/, metadata/ and tests/ with files; other files (README.md) stay.
func Write(dir string, files map[string][]byte) error {
	for _, sub := range []string{"manifests", "metadata", "tests"} {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return err
		}
	}
	for _, name := range sortedKeys(files) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

func decodeAll(rendered []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("olmbundle: decode rendering: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" {
			return nil, fmt.Errorf("olmbundle: object without kind in the rendering: %v", m)
		}
		out = append(out, u)
	}
}

// collectImages records the manager image and the default engine and router images its flags
// name, for relatedImages (what a disconnected cluster must mirror).
func collectImages(d *unstructured.Unstructured, into map[string]string) error {
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		cm, ok := c.(map[string]any)
		if !ok {
			return fmt.Errorf("olmbundle: Deployment %s: container is not an object", d.GetName())
		}
		if cm["name"] == "manager" {
			img, _ := cm["image"].(string)
			if img == "" {
				return fmt.Errorf("olmbundle: Deployment %s: manager container has no image", d.GetName())
			}
			into["manager"] = img
		}
		args, _ := cm["args"].([]any)
		for _, a := range args {
			s, _ := a.(string)
			if v, ok := strings.CutPrefix(s, "--default-router-image="); ok {
				into["kvrouter"] = v
			}
			if v, ok := strings.CutPrefix(s, "--default-engine-image="); ok {
				into["vllm"] = v
			}
		}
	}
	if into["manager"] == "" {
		return fmt.Errorf("olmbundle: Deployment %s has no container named manager", d.GetName())
	}
	return nil
}

// permissions turns each binding to a ServiceAccount into the CSV's clusterPermissions
// (ClusterRoleBinding) or permissions (RoleBinding) entry.
func permissions(roles map[string]*unstructured.Unstructured, bindings []*unstructured.Unstructured) (cluster, namespaced []any, err error) {
	sort.Slice(bindings, func(i, j int) bool { return bindings[i].GetName() < bindings[j].GetName() })
	for _, b := range bindings {
		kind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		role := roles[kind+"/"+name]
		if role == nil {
			return nil, nil, fmt.Errorf("olmbundle: %s %s refers to %s %s, which is not in the rendering", b.GetKind(), b.GetName(), kind, name)
		}
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		for _, s := range subjects {
			sm, _ := s.(map[string]any)
			if sm["kind"] != "ServiceAccount" {
				return nil, nil, fmt.Errorf("olmbundle: %s %s binds %v, not a ServiceAccount", b.GetKind(), b.GetName(), sm["kind"])
			}
			entry := map[string]any{"serviceAccountName": sm["name"], "rules": rules}
			if b.GetKind() == "ClusterRoleBinding" {
				cluster = append(cluster, entry)
			} else {
				namespaced = append(namespaced, entry)
			}
		}
	}
	if len(cluster) == 0 {
		return nil, nil, errors.New("olmbundle: no ClusterRoleBinding to a ServiceAccount: the manager would have no permissions")
	}
	return cluster, namespaced, nil
}

func scorecardConfig() map[string]any {
	test := func(suite, name string) map[string]any {
		return map[string]any{
			"entrypoint": []any{"scorecard-test", name},
			"image":      ScorecardImage,
			"labels":     map[string]any{"suite": suite, "test": name + "-test"},
		}
	}
	return map[string]any{
		"apiVersion": "scorecard.operatorframework.io/v1alpha3",
		"kind":       "Configuration",
		"metadata":   map[string]any{"name": "config"},
		"stages": []any{map[string]any{
			"parallel": true,
			"tests": []any{
				test("basic", "basic-check-spec"),
				test("olm", "olm-bundle-validation"),
				test("olm", "olm-crds-have-validation"),
				test("olm", "olm-crds-have-resources"),
				test("olm", "olm-spec-descriptors"),
				test("olm", "olm-status-descriptors"),
			},
		}},
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
