// Package validationtest loads the table of invalid KVRoutedModels (testdata/render/
// invalid-cases.yaml) that the offline validator, `kvroutectl render` and a real
// kube-apiserver must all reject the same way.
package validationtest

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// Case is one invalid resource.
type Case struct {
	Name string `json:"name"`
	// Field is the path the error must name, e.g. spec.engine.port.
	Field string `json:"field"`
	// Contains is an extra fragment the message must hold (optional).
	Contains string `json:"contains,omitempty"`
	// MetadataName overrides the generated metadata.name.
	MetadataName string `json:"metadataName,omitempty"`
	// Spec is merged over a valid base spec; a null value deletes the key.
	Spec map[string]interface{} `json:"spec"`
}

// Base is the valid resource every case starts from.
func Base(name string) map[string]interface{} {
	return map[string]interface{}{
		"apiVersion": "serving.kvroute.io/v1alpha1",
		"kind":       "KVRoutedModel",
		"metadata":   map[string]interface{}{"name": name},
		"spec": map[string]interface{}{
			"model": map[string]interface{}{"name": "m", "uri": "hf://org/m"},
		},
	}
}

// Load reads the table.
func Load(path string) ([]Case, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cases []Case
	if err := yaml.UnmarshalStrict(b, &cases); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cases, nil
}

// Object is the case's full resource; its name is "bad-<index>" unless MetadataName is set.
func (c Case) Object(index int) map[string]interface{} {
	obj := Base(fmt.Sprintf("bad-%d", index))
	if c.MetadataName != "" {
		obj["metadata"].(map[string]interface{})["name"] = c.MetadataName
	}
	merge(obj["spec"].(map[string]interface{}), c.Spec)
	return obj
}

// YAML is Object as a document.
func (c Case) YAML(index int) []byte {
	b, err := yaml.Marshal(c.Object(index))
	if err != nil {
		panic(err) // maps of YAML-decoded values always marshal
	}
	return b
}

func merge(dst, src map[string]interface{}) {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}
