package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// InferencePoolResource is the Gateway API Inference Extension's pool (GA, v1).
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// InferencePoolOptions name the pool whose pods are the engines.
type InferencePoolOptions struct {
	Namespace string
	Name      string
	// Pods says how to read the pool's pods (annotations, engine container, debounce,
	// logger); its Selector and Port come from the pool.
	Pods KubernetesOptions
}

// PoolTarget is what the router reads of an InferencePool: its pods' selector and the ports
// that serve them.
type PoolTarget struct {
	Selector string
	Ports    []int
}

// maxTargetPorts is the Inference Extension's bound on spec.targetPorts (v1 API: MaxItems=8).
const maxTargetPorts = 8

// PoolTargetOf reads a pool's spec.selector.matchLabels and spec.targetPorts[].number (the v1
// API, sigs.k8s.io/gateway-api-inference-extension api/v1/inferencepool_types.go, read as
// unstructured so the router needs no copy of the API module). A pool whose selector is empty
// would match every pod of the namespace, so it is refused.
func PoolTargetOf(p *unstructured.Unstructured) (PoolTarget, error) {
	ns, name := p.GetNamespace(), p.GetName()
	ml, _, err := unstructured.NestedStringMap(p.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.selector.matchLabels: %w", ns, name, err)
	}
	if len(ml) == 0 {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.selector.matchLabels is empty (it would match every pod of the namespace); name the engine pods' labels", ns, name)
	}
	set := labels.Set(ml)
	if _, err := labels.ValidatedSelectorFromSet(set); err != nil {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.selector.matchLabels: %w", ns, name, err)
	}
	t := PoolTarget{Selector: labels.SelectorFromSet(set).String()}
	tps, _, err := unstructured.NestedSlice(p.Object, "spec", "targetPorts")
	if err != nil {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.targetPorts: %w", ns, name, err)
	}
	if len(tps) > maxTargetPorts {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.targetPorts has %d entries, at most %d are allowed", ns, name, len(tps), maxTargetPorts)
	}
	for i, tp := range tps {
		m, ok := tp.(map[string]any)
		if !ok {
			return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.targetPorts[%d] is not an object", ns, name, i)
		}
		n, ok, err := unstructured.NestedInt64(m, "number")
		if err != nil || !ok || n < 1 || n > 65535 {
			return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.targetPorts[%d].number must be a port in 1..65535 (got %v)", ns, name, i, m["number"])
		}
		if slices.Contains(t.Ports, int(n)) {
			return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.targetPorts[%d].number %d is listed twice", ns, name, i, n)
		}
		t.Ports = append(t.Ports, int(n))
	}
	if len(t.Ports) == 0 {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: spec.targetPorts is empty; list the engine's port (one per DP rank)", ns, name)
	}
	return t, nil
}

// PoolEngines maps the engines found on the pool's first target port to the pool's endpoints.
// With one port an engine is one endpoint (its DP ranks, if any, pinned by header as usual).
// With several, each port is one DP rank's own HTTP server: rank r of a pod becomes an
// engine of its own, "<pod>-rank<r>", at the pod's address on port r, with rank r's event,
// replay and snapshot endpoints.
func PoolEngines(es []Engine, ports []int) []Engine {
	if len(ports) <= 1 {
		return es
	}
	out := make([]Engine, 0, len(es)*len(ports))
	for _, e := range es {
		u, err := url.Parse(e.URL)
		if err != nil {
			continue
		}
		host := u.Hostname()
		for r, port := range ports {
			re := e
			re.Name = e.Name + "-rank" + strconv.Itoa(r)
			re.URL = "http://" + net.JoinHostPort(host, strconv.Itoa(port))
			re.Events, re.Replay, re.Snapshot = rankOf(e.Events, r), rankOf(e.Replay, r), rankOf(e.Snapshot, r)
			out = append(out, re)
		}
	}
	sortEngines(out)
	return out
}

// rankOf is rank r's endpoint as a one-rank list (nil when the engine announced none).
func rankOf(eps []string, r int) []string {
	if r >= len(eps) || eps[r] == "" {
		return nil
	}
	return []string{eps[r]}
}

type poolSource struct {
	dyn  dynamic.Interface
	pods kubernetes.Interface
	o    InferencePoolOptions
}

// NewInferencePool follows one InferencePool: its pods (spec.selector) on its target ports
// are the engines, read as NewKubernetes reads pods. A change of the pool's selector or ports
// restarts the pod watch; a pool that is missing or unusable yields no engines (logged).
//
// The router needs get/list/watch on inferencepools and pods in the namespace.
func NewInferencePool(cfg *rest.Config, o InferencePoolOptions) (Source, error) {
	if cfg == nil {
		return nil, errors.New("inferencepool discovery: no REST config")
	}
	if o.Namespace == "" || o.Name == "" {
		return nil, errors.New("inferencepool discovery: the pool's namespace and name are required")
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("inferencepool discovery: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("inferencepool discovery: %w", err)
	}
	return newPoolSource(dyn, cs, o), nil
}

// newPoolSource follows a pool through the given clients (tests give fakes).
func newPoolSource(dyn dynamic.Interface, pods kubernetes.Interface, o InferencePoolOptions) *poolSource {
	o.Pods.Namespace = o.Namespace
	o.Pods.fill()
	return &poolSource{dyn: dyn, pods: pods, o: o}
}

func (s *poolSource) Run(ctx context.Context, update func([]Engine)) error {
	log := s.o.Pods.Logger
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.dyn, 0, s.o.Namespace, func(lo *metav1.ListOptions) {
		lo.FieldSelector = "metadata.name=" + s.o.Name
	})
	defer factory.Shutdown()
	inf := factory.ForResource(InferencePoolResource).Informer()
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		log.Warn("inferencepool discovery: watching the pool failed; retrying (is the InferencePool CRD installed, and may the router read it?)",
			"namespace", s.o.Namespace, "pool", s.o.Name, "err", err)
	}); err != nil {
		return fmt.Errorf("inferencepool discovery: %w", err)
	}
	changed := make(chan struct{}, 1)
	mark := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { mark() }, UpdateFunc: func(any, any) { mark() }, DeleteFunc: func(any) { mark() },
	}); err != nil {
		return fmt.Errorf("inferencepool discovery: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended
	}
	mark()
	var (
		current   PoolTarget
		running   bool
		stopPods  context.CancelFunc
		podsEnded chan struct{}
		lastErr   string
	)
	stop := func() {
		if stopPods != nil {
			stopPods()
			<-podsEnded
			stopPods = nil
		}
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		t, err := s.target(inf.GetStore())
		if err != nil {
			if err.Error() != lastErr {
				log.Error("inferencepool discovery: no engines", "err", err)
				lastErr = err.Error()
			}
			stop()
			running = false
			update(nil)
			continue
		}
		lastErr = ""
		if running && t.Selector == current.Selector && slices.Equal(t.Ports, current.Ports) {
			continue
		}
		stop()
		current, running = t, true
		po := s.o.Pods
		po.Selector, po.Port = t.Selector, t.Ports[0]
		src := &kubeSource{client: s.pods, o: po}
		pctx, cancel := context.WithCancel(ctx)
		stopPods, podsEnded = cancel, make(chan struct{})
		ports := slices.Clone(t.Ports)
		go func(done chan struct{}) {
			defer close(done)
			if err := src.Run(pctx, func(es []Engine) { update(PoolEngines(es, ports)) }); err != nil {
				log.Error("inferencepool discovery: watching the pool's pods", "err", err)
			}
		}(podsEnded)
	}
}

// target reads the pool from the informer's store.
func (s *poolSource) target(store cache.Store) (PoolTarget, error) {
	obj, ok, err := store.GetByKey(s.o.Namespace + "/" + s.o.Name)
	if err != nil {
		return PoolTarget{}, err
	}
	if !ok {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s not found", s.o.Namespace, s.o.Name)
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return PoolTarget{}, fmt.Errorf("InferencePool %s/%s: unexpected %T", s.o.Namespace, s.o.Name, obj)
	}
	return PoolTargetOf(u)
}
