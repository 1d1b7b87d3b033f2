package render

// spec.router.mode EndpointPicker: the router as the Gateway API Inference Extension's endpoint
// picker. The gateway sends each request to an engine pod itself and asks the router which one
// over Envoy ext_proc (kvrouter --ext-proc-listen, config extProc.listen); the pool it routes to
// is an InferencePool (inference.networking.k8s.io/v1) the operator renders, and the router
// discovers the engines from that same pool (config discovery.inferencePool), so the picker
// and the gateway see one set of endpoints.

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/router/config"
)

// RouterGRPCPort is the picker's gRPC port in the router pod and on its Service: Envoy
// ext_proc and the gRPC health services liveness and readiness. 9002 is the port the Inference
// Extension's own picker and its examples use.
const RouterGRPCPort = 9002

// grpcPortName names the picker's port on the router container and Service.
const grpcPortName = "grpc"

// InferencePoolGVK is the Inference Extension's pool (GA, v1). The operator renders it as
// unstructured: the Extension's Go module is not on this project's module list, and the
// operator writes only the four spec fields below.
var InferencePoolGVK = schema.GroupVersionKind{Group: "inference.networking.k8s.io", Version: "v1", Kind: "InferencePool"}

// EndpointPicker reports whether the router runs as the InferencePool's endpoint picker.
func EndpointPicker(m *v1alpha1.KVRoutedModel) bool {
	return m.Spec.Router.Mode == v1alpha1.RouterModeEndpointPicker
}

// InferencePoolName is the pool's name: the model's, so an HTTPRoute's backendRef reads as the
// model it serves.
func InferencePoolName(m *v1alpha1.KVRoutedModel) string { return m.Name }

// PickerEndpoint is the picker's gRPC address (host:port), the pool's endpointPickerRef.
func PickerEndpoint(m *v1alpha1.KVRoutedModel) string {
	return fmt.Sprintf("%s.%s.svc:%d", RouterName(m), m.Namespace, RouterGRPCPort)
}

// pickerFailureMode is spec.router.endpointPicker.failureMode, FailClose when unset.
func pickerFailureMode(m *v1alpha1.KVRoutedModel) string {
	if ep := m.Spec.Router.EndpointPicker; ep != nil && ep.FailureMode != "" {
		return ep.FailureMode
	}
	return "FailClose"
}

// InferencePool renders the pool for mode EndpointPicker (nil otherwise): the engine pods by
// their selector, on the engine's HTTP port, with the router Service's gRPC port as its picker.
//
// One target port whatever spec.engine.parallelism.dataLocal: the operator's engines serve
// every DP rank of a pod on one HTTP port (vLLM --data-parallel-size, SGLang --dp-size), and the
// picker pins the rank with a header (x-data-parallel-rank) as the proxy does. A pool with
// several target ports tells the picker that each port is one rank's own HTTP server
// (router/discovery PoolEngines), which these engines are not.
func InferencePool(m *v1alpha1.KVRoutedModel) (*unstructured.Unstructured, error) {
	if !EndpointPicker(m) {
		return nil, nil
	}
	om, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ptr(objectMeta(m, InferencePoolName(m), v1alpha1.ComponentEngine)))
	if err != nil {
		return nil, err
	}
	delete(om, "creationTimestamp")
	sel := map[string]interface{}{}
	for k, v := range EngineSelector(m) {
		sel[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]interface{}{
		"metadata": om,
		"spec": map[string]interface{}{
			"selector":    map[string]interface{}{"matchLabels": sel},
			"targetPorts": []interface{}{map[string]interface{}{"number": int64(m.Spec.Engine.Port)}},
			"endpointPickerRef": map[string]interface{}{
				"name":        RouterName(m),
				"port":        map[string]interface{}{"number": int64(RouterGRPCPort)},
				"failureMode": pickerFailureMode(m),
			},
		},
	}}
	u.SetGroupVersionKind(InferencePoolGVK)
	return u, nil
}

// pickerPeers are the peers spec.router.endpointPicker.allowFrom admits (the gateway's
// proxies); unset, the pods of the model's own namespace.
func pickerPeers(m *v1alpha1.KVRoutedModel) []networkingv1.NetworkPolicyPeer {
	ep := m.Spec.Router.EndpointPicker
	if ep == nil || len(ep.AllowFrom) == 0 {
		return []networkingv1.NetworkPolicyPeer{podsLabelled(nil)}
	}
	out := make([]networkingv1.NetworkPolicyPeer, len(ep.AllowFrom))
	for i := range ep.AllowFrom {
		ep.AllowFrom[i].DeepCopyInto(&out[i])
	}
	return out
}

// RouterPickerTLSDir is where a picker's certificate Secret (mode Secret) is mounted.
const RouterPickerTLSDir = "/etc/kvroute/picker-tls"

// pickerTLS is the picker's TLS spec with its default (SelfSigned) applied.
func pickerTLS(m *v1alpha1.KVRoutedModel) v1alpha1.EndpointPickerTLS {
	if ep := m.Spec.Router.EndpointPicker; ep != nil && ep.TLS != nil && ep.TLS.Mode != "" {
		return *ep.TLS
	}
	return v1alpha1.EndpointPickerTLS{Mode: v1alpha1.PickerTLSSelfSigned}
}

// pickerTLSConfig is the router config's extProc.tls: a self-signed certificate, the mounted
// Secret's, or none (plaintext).
func pickerTLSConfig(m *v1alpha1.KVRoutedModel) *config.ExtProcTLS {
	switch pickerTLS(m).Mode {
	case v1alpha1.PickerTLSDisabled:
		return nil
	case v1alpha1.PickerTLSSecret:
		return &config.ExtProcTLS{CertDir: RouterPickerTLSDir}
	}
	return &config.ExtProcTLS{}
}

// pickerTLSPod mounts the certificate Secret of mode Secret. The kubelet updates a mounted
// Secret in place, and the router re-reads the files on the next handshake, so a rotation
// (cert-manager's) rolls no pod.
func pickerTLSPod(m *v1alpha1.KVRoutedModel, c *corev1.Container, volumes *[]corev1.Volume) {
	t := pickerTLS(m)
	if !EndpointPicker(m) || t.Mode != v1alpha1.PickerTLSSecret {
		return
	}
	*volumes = append(*volumes, corev1.Volume{Name: "picker-tls", VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: t.SecretName, DefaultMode: ptr(int32(0o440))}}})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "picker-tls", MountPath: RouterPickerTLSDir, ReadOnly: true})
}

// pickerServicePort is the router Service's gRPC port. appProtocol http2 tells the gateway to
// speak HTTP/2 to it, as the Inference Extension's own picker Service does.
func pickerServicePort() corev1.ServicePort {
	return corev1.ServicePort{Name: grpcPortName, Port: RouterGRPCPort, TargetPort: intstr.FromString(grpcPortName),
		Protocol: corev1.ProtocolTCP, AppProtocol: ptr("http2")}
}
