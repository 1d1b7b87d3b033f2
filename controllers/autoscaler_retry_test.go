package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// denyHPAs makes the API server refuse HorizontalPodAutoscalers in ns, through a real
// ValidatingAdmissionPolicy and its binding; the returned func lifts the denial.
func denyHPAs(t *testing.T, ns string) func() {
	t.Helper()
	ctx := context.Background()
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-hpa-" + ns},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{"autoscaling"}, APIVersions: []string{"*"}, Resources: []string{"horizontalpodautoscalers"}},
				}}}},
			Validations: []admissionv1.Validation{{Expression: "false", Message: "HPAs are refused for this test"}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-hpa-" + ns},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}},
		},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	lift := func() {
		for _, o := range []client.Object{binding, policy} {
			if err := k8s.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		}
	}
	t.Cleanup(lift)
	// The policy takes effect once the API server's admission plugin has seen it: probe with
	// a dry-run create until it is refused.
	probe := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{MaxReplicas: 1,
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "x"}},
	}
	eventually(t, 20*time.Second, func() error {
		if err := k8s.Create(ctx, probe.DeepCopy(), client.DryRunAll); err == nil {
			return fmt.Errorf("HPA create still admitted")
		}
		return nil
	})
	return lift
}

// A failed autoscaler apply is returned from the pass, so the model is reconciled again with
// backoff and recovers on its own once the failure passes; before, it was recorded only in the
// status and the model stayed Degraded/ApplyFailed until an unrelated event.
func TestAutoscalerApplyFailureIsRetried(t *testing.T) {
	ns := namespace(t, "as-retry")
	lift := denyHPAs(t, ns)
	m := newModel(t, ns, "qwen", func(m *v1alpha1.KVRoutedModel) {
		m.Spec.Autoscaling = &v1alpha1.AutoscalingSpec{Provider: "HPA", MaxReplicas: 3}
	})
	got := waitCondition(t, m, v1alpha1.ConditionDegraded, "True/ApplyFailed")
	if c := describe(got.Status.Conditions); !strings.Contains(c, "HPAs are refused") {
		t.Fatalf("the condition does not carry the API server's refusal: %s", c)
	}
	lift()
	// Nothing else changes in the namespace: only the pass's own requeue can create the HPA.
	eventually(t, 30*time.Second, func() error {
		return k8s.Get(context.Background(), key(ns, "qwen"), &autoscalingv2.HorizontalPodAutoscaler{})
	})
	eventually(t, 20*time.Second, func() error {
		if c := condition(getModel(t, m), v1alpha1.ConditionDegraded); c == "True/ApplyFailed" {
			return fmt.Errorf("still %s after the HPA was applied", c)
		}
		return nil
	})
}
