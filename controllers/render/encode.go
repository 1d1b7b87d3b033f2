package render

import (
	"bytes"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// YAML writes objects as a multi-document YAML stream, without the zero status and null
// creationTimestamp fields typed objects carry (a child's status is never ours to set).
func YAML(objs []client.Object) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		var content map[string]interface{}
		if ok {
			content = u.Object
		} else {
			c, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
			if err != nil {
				return nil, fmt.Errorf("object %d (%T): %w", i, o, err)
			}
			content = c
		}
		if o.GetObjectKind().GroupVersionKind().Kind == "" {
			return nil, fmt.Errorf("object %d (%T) has no TypeMeta", i, o)
		}
		content = runtime.DeepCopyJSON(content)
		dropNoise(content)
		b, err := yaml.Marshal(content)
		if err != nil {
			return nil, err
		}
		buf.WriteString("---\n")
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

func dropNoise(obj map[string]interface{}) {
	delete(obj, "status")
	for _, path := range [][]string{{"metadata"}, {"spec", "template", "metadata"}} {
		if m, found, _ := unstructured.NestedMap(obj, path...); found {
			if v, ok := m["creationTimestamp"]; ok && v == nil {
				unstructured.RemoveNestedField(obj, append(path, "creationTimestamp")...)
			}
		}
	}
}
