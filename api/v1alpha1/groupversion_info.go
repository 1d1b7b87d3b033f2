// Package v1alpha1 holds the KVRoutedModel API (serving.kvroute.io/v1alpha1).
// +kubebuilder:object:generate=true
// +groupName=serving.kvroute.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "serving.kvroute.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types in this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Kind is the kind of the only resource in this package.
const Kind = "KVRoutedModel"

func init() {
	SchemeBuilder.Register(&KVRoutedModel{}, &KVRoutedModelList{})
}
