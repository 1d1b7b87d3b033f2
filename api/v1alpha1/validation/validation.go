// Package validation admits KVRoutedModel resources offline the way kube-apiserver does: it
// builds the structural schema from the embedded CRD, prunes unknown fields (strictly), applies
// the schema's defaults, and runs OpenAPI and CEL validation with the apiextensions-apiserver
// libraries. `kvroutectl render`, the render tests and the reconciler's tests share it, so the
// defaults and rules exist once: in the CRD generated from api/v1alpha1's markers.
package validation

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/api/v1alpha1/crd"
)

// Validator admits objects of one CRD version.
type Validator struct {
	gvk        schema.GroupVersionKind
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator
	scale      *apiextensions.CustomResourceSubresourceScale
}

// New returns a Validator for the embedded KVRoutedModel CRD.
func New() (*Validator, error) {
	return NewFromCRD(crd.KVRoutedModelYAML, v1alpha1.GroupVersion.Version)
}

// ParseCRD decodes a v1 CRD and converts it to the internal type the libraries take. It also
// runs the apiserver's own CRD validation, which is where an over-budget CEL rule or a bad
// default would be refused at install time.
func ParseCRD(crdYAML []byte) (*apiextensions.CustomResourceDefinition, error) {
	var v1crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &v1crd); err != nil {
		return nil, fmt.Errorf("decode CRD: %w", err)
	}
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&v1crd)
	var internal apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1crd, &internal, nil); err != nil {
		return nil, fmt.Errorf("convert CRD: %w", err)
	}
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
		return nil, fmt.Errorf("CRD %s would be refused by the apiserver: %w", v1crd.Name, errs.ToAggregate())
	}
	return &internal, nil
}

// NewFromCRD returns a Validator for one version of the given CRD.
func NewFromCRD(crdYAML []byte, version string) (*Validator, error) {
	c, err := ParseCRD(crdYAML)
	if err != nil {
		return nil, err
	}
	var props *apiextensions.JSONSchemaProps
	if c.Spec.Validation != nil {
		props = c.Spec.Validation.OpenAPIV3Schema
	}
	var scale *apiextensions.CustomResourceSubresourceScale
	if c.Spec.Subresources != nil {
		scale = c.Spec.Subresources.Scale
	}
	for _, v := range c.Spec.Versions {
		if v.Name != version {
			continue
		}
		if v.Schema != nil {
			props = v.Schema.OpenAPIV3Schema
		}
		if v.Subresources != nil {
			scale = v.Subresources.Scale
		}
	}
	if props == nil {
		return nil, fmt.Errorf("CRD %s has no schema for version %s", c.Name, version)
	}
	s, err := structuralschema.NewStructural(props)
	if err != nil {
		return nil, fmt.Errorf("structural schema: %w", err)
	}
	// As the apiserver does: keep the validation copy intact, prune defaults on the working one.
	s = s.DeepCopy()
	if err := structuraldefaulting.PruneDefaults(s); err != nil {
		return nil, fmt.Errorf("prune defaults: %w", err)
	}
	sv, _, err := apiservervalidation.NewSchemaValidator(props)
	if err != nil {
		return nil, fmt.Errorf("schema validator: %w", err)
	}
	return &Validator{
		gvk:        schema.GroupVersionKind{Group: c.Spec.Group, Version: version, Kind: c.Spec.Names.Kind},
		structural: s,
		schema:     sv,
		cel:        cel.NewValidator(s, true, celconfig.PerCallLimit),
		scale:      scale,
	}, nil
}

// Prune drops fields the schema does not declare and returns their paths (sorted), the
// paths a server with fieldValidation=Strict refuses.
func (v *Validator) Prune(obj map[string]interface{}) []string {
	unknown := structuralpruning.PruneWithOptions(obj, v.structural, true,
		structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(obj, v.structural)
	sort.Strings(unknown)
	return unknown
}

// Default applies the schema's defaults in place, as the apiserver does on create and read.
func (v *Validator) Default(obj map[string]interface{}) {
	structuraldefaulting.Default(obj, v.structural)
}

// Validate returns what the apiserver's create validation returns for an already pruned and
// defaulted object: metadata, OpenAPI schema, list-type invariants, then CEL (skipped, as
// there, when an error makes the rules meaningless).
func (v *Validator) Validate(ctx context.Context, obj map[string]interface{}) field.ErrorList {
	u := &unstructured.Unstructured{Object: obj}
	var errs field.ErrorList
	if gvk := u.GroupVersionKind(); gvk != v.gvk {
		return field.ErrorList{field.Invalid(field.NewPath("apiVersion"), u.GetAPIVersion(),
			fmt.Sprintf("want %s, kind %s; got apiVersion %q, kind %q", v.gvk.GroupVersion(), v.gvk.Kind, u.GetAPIVersion(), u.GetKind()))}
	}
	errs = append(errs, metavalidation.ValidateObjectMetaAccessor(u, true, metavalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj, v.schema)...)
	errs = append(errs, v.validateScale(obj)...)
	errs = append(errs, schemaobjectmeta.Validate(ctx, nil, obj, v.structural, false)...)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, v.structural, obj)...)
	if blocking := blockingError(errs); blocking != nil {
		return append(errs, blocking)
	}
	celErrs, _ := v.cel.Validate(ctx, nil, v.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

// validateScale checks what the apiserver checks for a /scale subresource: the replica
// paths hold int32-range non-negative integers and the selector path a string.
func (v *Validator) validateScale(obj map[string]interface{}) field.ErrorList {
	if v.scale == nil {
		return nil
	}
	var errs field.ErrorList
	replicas := func(jsonPath string) {
		n, _, err := unstructured.NestedInt64(obj, strings.Split(strings.TrimPrefix(jsonPath, "."), ".")...)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(field.NewPath(jsonPath), n, err.Error()))
		case n < 0:
			errs = append(errs, field.Invalid(field.NewPath(jsonPath), n, "should be a non-negative integer"))
		case n > math.MaxInt32:
			errs = append(errs, field.Invalid(field.NewPath(jsonPath), n, fmt.Sprintf("should be less than or equal to %v", math.MaxInt32)))
		}
	}
	replicas(v.scale.SpecReplicasPath)
	replicas(v.scale.StatusReplicasPath)
	if p := v.scale.LabelSelectorPath; p != nil {
		if sel, _, err := unstructured.NestedString(obj, strings.Split(strings.TrimPrefix(*p, "."), ".")...); err != nil {
			errs = append(errs, field.Invalid(field.NewPath(*p), sel, err.Error()))
		}
	}
	return errs
}

// blockingError mirrors the apiserver: these error types stop the CEL rules from running.
func blockingError(errs field.ErrorList) *field.Error {
	for _, e := range errs {
		switch e.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")
		}
	}
	return nil
}

// Admit decodes one YAML or JSON document and does what `kubectl apply` against a cluster
// would: strict unknown-field check, defaulting, validation. namespace fills an empty
// metadata.namespace. Errors are the apiserver's (*apierrors.StatusError), so err.Error() is
// the message kubectl would print after "Error from server".
func (v *Validator) Admit(ctx context.Context, doc []byte, namespace string) (*v1alpha1.KVRoutedModel, error) {
	// Decode as the apiserver does: integers stay int64 (CEL's int), not float64. A key given
	// twice in one mapping is an error, as with kubectl's strict field validation: the last
	// one silently winning hides edits.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("decode: %v", err))
	}
	obj := map[string]interface{}{}
	if err := utiljson.Unmarshal(js, &obj); err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("decode: %v", err))
	}
	if len(obj) == 0 {
		return nil, apierrors.NewBadRequest("decode: empty document")
	}
	u := &unstructured.Unstructured{Object: obj}
	if u.GetNamespace() == "" && namespace != "" {
		u.SetNamespace(namespace)
	}
	if gvk := u.GroupVersionKind(); gvk != v.gvk {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("want apiVersion %s and kind %s, got apiVersion %q and kind %q",
			v.gvk.GroupVersion(), v.gvk.Kind, u.GetAPIVersion(), u.GetKind()))
	}
	if unknown := v.Prune(obj); len(unknown) > 0 {
		errs := make([]error, 0, len(unknown))
		for _, p := range unknown {
			errs = append(errs, fmt.Errorf("unknown field %q", p))
		}
		// The apiserver's wording for a strict (fieldValidation=Strict) decoding failure.
		return nil, apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %v",
			v.gvk.Kind, v.gvk.Version, v.gvk.Kind, runtime.NewStrictDecodingError(errs)))
	}
	v.Default(obj)
	if errs := v.Validate(ctx, obj); len(errs) > 0 {
		return nil, apierrors.NewInvalid(v.gvk.GroupKind(), u.GetName(), errs)
	}
	var m v1alpha1.KVRoutedModel
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &m); err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("convert to %s: %v", v.gvk.Kind, err))
	}
	return &m, nil
}

// DefaultModel applies the schema's defaults to a typed object, for callers (tests, the
// reconciler's unit tests) that build resources in Go rather than reading them from a server.
func (v *Validator) DefaultModel(m *v1alpha1.KVRoutedModel) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(m)
	if err != nil {
		return err
	}
	v.Default(obj)
	var out v1alpha1.KVRoutedModel
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &out); err != nil {
		return err
	}
	*m = out
	return nil
}
