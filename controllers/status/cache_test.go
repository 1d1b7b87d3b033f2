package status

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

func TestModelCacheStatus(t *testing.T) {
	m := &v1alpha1.KVRoutedModel{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns"}}
	if ModelCache(m, nil) != nil {
		t.Error("a status without spec.model.cache")
	}
	size := resource.MustParse("10Gi")
	m.Spec.Model.Cache = &v1alpha1.ModelCacheSpec{Size: &size, AccessMode: corev1.ReadWriteMany}
	claim := func(phase corev1.PersistentVolumeClaimPhase, modes ...corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{
			Spec:   corev1.PersistentVolumeClaimSpec{AccessModes: modes},
			Status: corev1.PersistentVolumeClaimStatus{Phase: phase, Capacity: corev1.ResourceList{corev1.ResourceStorage: size}},
		}
	}
	for name, tc := range map[string]struct {
		pvc  *corev1.PersistentVolumeClaim
		want string // message fragment, "" for none
	}{
		"bound":           {claim(corev1.ClaimBound, corev1.ReadWriteMany), ""},
		"pending":         {claim(corev1.ClaimPending, corev1.ReadWriteMany), ""},
		"missing":         {nil, "PersistentVolumeClaim ns/m-model-cache not found"},
		"lost":            {claim(corev1.ClaimLost, corev1.ReadWriteMany), "lost its volume"},
		"other mode":      {claim(corev1.ClaimBound, corev1.ReadWriteOnce), "has access modes [ReadWriteOnce], not spec.model.cache.accessMode ReadWriteMany"},
		"several, listed": {claim(corev1.ClaimBound, corev1.ReadWriteOnce, corev1.ReadWriteMany), ""},
	} {
		st := ModelCache(m, tc.pvc)
		if st.ClaimName != "m-model-cache" || !st.Managed {
			t.Errorf("%s: %+v", name, st)
		}
		if (tc.want == "") != (st.Message == "") || !strings.Contains(st.Message, tc.want) {
			t.Errorf("%s: message %q, want %q", name, st.Message, tc.want)
		}
		if tc.pvc != nil && (st.Phase != string(tc.pvc.Status.Phase) || st.Capacity != "10Gi") {
			t.Errorf("%s: phase %q capacity %q", name, st.Phase, st.Capacity)
		}
	}
	m.Spec.Model.Cache = &v1alpha1.ModelCacheSpec{ClaimName: "weights", AccessMode: corev1.ReadWriteOnce}
	if st := ModelCache(m, claim(corev1.ClaimBound, corev1.ReadWriteOnce)); st.ClaimName != "weights" || st.Managed || st.Message != "" {
		t.Errorf("existing claim: %+v", st)
	}
}
