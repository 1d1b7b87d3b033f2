package render

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvroute/kvroute/api/v1alpha1"
	"github.com/kvroute/kvroute/router/config"
)

// Several router replicas (spec.router.replicas > 1) share their in-flight load over NATS
// (router/peersync) and start from each other's index snapshot (GET /peer/snapshot on the admin
// port): each router embeds a NATS server whose route port the others reach through a headless
// Service, unless spec.router.sync.natsURL names an external server.

// RouterPeersPort is the embedded NATS server's route port in the router pod.
const RouterPeersPort = 6222

const (
	peersPortName = "peers"
	// peersTLSDir is where spec.router.sync.tlsSecretName is mounted.
	peersTLSDir = "/etc/kvrouter/peers-tls"
)

// RouterPeersName is the headless Service through which router pods find each other.
func RouterPeersName(m *v1alpha1.KVRoutedModel) string { return m.Name + "-router-peers" }

// DefaultRouterReplicas is the router Deployment's size when spec.router.replicas is unset: two,
// so that a rolling update or a drained node always leaves one router serving, with the other's
// index to start from.
const DefaultRouterReplicas = 2

// RouterReplicas is the router Deployment's size: spec.router.replicas, or DefaultRouterReplicas
// (1 with EnginesConnect, where each engine sends its events to one router).
func RouterReplicas(m *v1alpha1.KVRoutedModel) int32 {
	if r := m.Spec.Router.Replicas; r != nil {
		return *r
	}
	if EnginesConnect(m) {
		return 1
	}
	return DefaultRouterReplicas
}

// severalRouters: the clustering is rendered.
func severalRouters(m *v1alpha1.KVRoutedModel) bool { return RouterReplicas(m) > 1 }

// embeddedNATS: several routers, each with its own NATS server (no external URL).
func embeddedNATS(m *v1alpha1.KVRoutedModel) bool {
	return severalRouters(m) && (m.Spec.Router.Sync == nil || m.Spec.Router.Sync.NATSURL == "")
}

// routerPeersConfig is the config's peers block; nil with one router.
func routerPeersConfig(m *v1alpha1.KVRoutedModel) *config.Peers {
	if !severalRouters(m) {
		return nil
	}
	// One subject per model: an external server may carry several models' routers.
	p := &config.Peers{Subject: fmt.Sprintf("kvroute.load.%s.%s", m.Namespace, m.Name),
		PeerTimeout: metav1.Duration{Duration: 3 * time.Second}, ReadyTimeout: metav1.Duration{Duration: 10 * time.Second}}
	if s := m.Spec.Router.Sync; s != nil && s.NATSURL != "" {
		p.URL = s.NATSURL
	} else {
		p.ClusterListen = fmt.Sprintf(":%d", RouterPeersPort)
		// The headless Service's name resolves to every router pod (ready or not): the
		// embedded server dials one, NATS's gossip the rest.
		p.Routes = []string{fmt.Sprintf("%s.%s.svc:%d", RouterPeersName(m), m.Namespace, RouterPeersPort)}
	}
	if s := m.Spec.Router.Sync; s != nil && s.TLSSecretName != "" {
		p.TLS = &config.PeerTLS{CertFile: peersTLSDir + "/tls.crt", KeyFile: peersTLSDir + "/tls.key", CAFile: peersTLSDir + "/ca.crt"}
	}
	return p
}

// RouterPeersService is the headless Service of the router pods' route port. It publishes pods
// that are not ready yet: a starting router must reach its peers before it can be ready. Nil
// with one router or an external NATS server.
func RouterPeersService(m *v1alpha1.KVRoutedModel) *corev1.Service {
	if !embeddedNATS(m) {
		return nil
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: objectMeta(m, RouterPeersName(m), v1alpha1.ComponentRouter),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 RouterSelector(m),
			Ports: []corev1.ServicePort{{Name: peersPortName, Port: RouterPeersPort,
				TargetPort: intstr.FromString(peersPortName), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// RouterPodDisruptionBudget lets a drain take one router pod at a time, so the others keep
// serving and a restarted one has a peer to start from. Nil with one router (a budget would
// block every drain of its node).
func RouterPodDisruptionBudget(m *v1alpha1.KVRoutedModel) *policyv1.PodDisruptionBudget {
	if !severalRouters(m) {
		return nil
	}
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: objectMeta(m, RouterName(m), v1alpha1.ComponentRouter),
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: RouterSelector(m)},
			UnhealthyPodEvictionPolicy: ptr(policyv1.AlwaysAllow),
		},
	}
}

// routerPeersRule admits the router pods, and only them, to the route port (the admin port,
// where peers take snapshots, already admits the model's namespace).
func routerPeersRule(m *v1alpha1.KVRoutedModel) (networkingv1.NetworkPolicyIngressRule, bool) {
	if !embeddedNATS(m) {
		return networkingv1.NetworkPolicyIngressRule{}, false
	}
	return networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{podsLabelled(RouterSelector(m))},
		Ports: []networkingv1.NetworkPolicyPort{tcpPort(RouterPeersPort)},
	}, true
}

// routerPeersPod adds what the router container needs among peers: the route port, POD_IP (its
// snapshot URL on the wildcard admin address) and the TLS Secret.
func routerPeersPod(m *v1alpha1.KVRoutedModel, c *corev1.Container, vols *[]corev1.Volume) {
	if !severalRouters(m) {
		return
	}
	if embeddedNATS(m) {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: peersPortName, ContainerPort: RouterPeersPort, Protocol: corev1.ProtocolTCP})
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}})
	if s := m.Spec.Router.Sync; s != nil && s.TLSSecretName != "" {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "peers-tls", MountPath: peersTLSDir, ReadOnly: true})
		*vols = append(*vols, corev1.Volume{Name: "peers-tls", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: s.TLSSecretName, DefaultMode: ptr(int32(0o440))}}})
	}
}
