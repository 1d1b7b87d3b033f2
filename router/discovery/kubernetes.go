package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kvroute/kvroute/router/blockkey"
	"github.com/kvroute/kvroute/router/config"
	"github.com/kvroute/kvroute/router/engine"
)

// DefaultEngineContainer is the name the operator gives the vLLM container in engine pods.
const DefaultEngineContainer = "vllm"

// DefaultDebounce coalesces a burst of pod changes (a rollout, a status flurry at start-up)
// into one snapshot.
const DefaultDebounce = 100 * time.Millisecond

// KubernetesOptions select the engine pods and say how to read them.
type KubernetesOptions struct {
	// Namespace to watch (required; the router's Role covers only its own namespace).
	Namespace string
	// Selector is a label selector in kubectl syntax (required, non-empty). It is sent to
	// the API server, so the cache holds only this model's pods.
	Selector string
	// Port is the engines' HTTP port; 0 takes the engine container's port named "http".
	Port int
	// Container names the engine container, whose ports and restarts count; "" means
	// DefaultEngineContainer, or the pod's first container when none has that name.
	Container string
	// Annotation names; "" means the config.Default*Annotation the operator writes.
	EventsPortsAnnotation string
	ReplayPortsAnnotation string
	// SnapshotPortsAnnotation lists the engine's snapshot ports per DP rank; the operator
	// does not write it yet, so it is set on the engine pods by hand.
	SnapshotPortsAnnotation string
	BlockSizeAnnotation     string
	WarmupUntilAnnotation   string
	// Debounce is how long changes are gathered before one snapshot; 0 means DefaultDebounce.
	Debounce time.Duration
	// Logger receives pods whose annotations cannot be used and watch errors; nil means
	// slog.Default().
	Logger *slog.Logger
}

// KubernetesOptionsFromConfig maps the configuration file's discovery block.
func KubernetesOptionsFromConfig(k *config.KubernetesDiscovery) KubernetesOptions {
	return KubernetesOptions{
		Namespace: k.Namespace, Selector: k.Selector, Port: k.Port,
		EventsPortsAnnotation: k.EventsPortsAnnotation,
		ReplayPortsAnnotation: k.ReplayPortsAnnotation,
		BlockSizeAnnotation:   k.BlockSizeAnnotation,
		WarmupUntilAnnotation: k.WarmupUntilAnnotation,
	}
}

func (o *KubernetesOptions) fill() {
	fill := func(s *string, def string) {
		if *s == "" {
			*s = def
		}
	}
	fill(&o.Container, DefaultEngineContainer)
	fill(&o.EventsPortsAnnotation, config.DefaultEventsPortsAnnotation)
	fill(&o.ReplayPortsAnnotation, config.DefaultReplayPortsAnnotation)
	fill(&o.SnapshotPortsAnnotation, config.DefaultSnapshotPortsAnnotation)
	fill(&o.BlockSizeAnnotation, config.DefaultBlockSizeAnnotation)
	fill(&o.WarmupUntilAnnotation, config.DefaultWarmupUntilAnnotation)
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

type kubeSource struct {
	client kubernetes.Interface
	o      KubernetesOptions
}

// NewKubernetes watches the pods matching o.Selector in o.Namespace. Each pod with an IP
// (and not finished) is an engine: URL http://<podIP>:<port>, events and replay
// tcp://<podIP>:<port> per rank from the annotations, block size and warm-up from theirs,
// Ready from the pod's Ready condition unless it is terminating, and an Incarnation of pod
// UID and engine-container restart count. A pod with an unusable annotation stays routable
// with that field unset (its events fall back to approximate scoring) and is logged.
//
// The router needs get/list/watch on pods in the namespace.
func NewKubernetes(cfg *rest.Config, o KubernetesOptions) (Source, error) {
	if cfg == nil {
		return nil, errors.New("kubernetes discovery: no REST config")
	}
	if o.Namespace == "" {
		return nil, errors.New("kubernetes discovery: namespace is required")
	}
	if strings.TrimSpace(o.Selector) == "" {
		return nil, errors.New("kubernetes discovery: selector is required (an empty selector would match every pod)")
	}
	sel, err := labels.Parse(o.Selector)
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery: selector %q: %w", o.Selector, err)
	}
	if sel.Empty() {
		return nil, fmt.Errorf("kubernetes discovery: selector %q matches every pod", o.Selector)
	}
	if o.Port < 0 || o.Port > 65535 {
		return nil, fmt.Errorf("kubernetes discovery: port %d is out of range 0..65535 (0 = the container port named http)", o.Port)
	}
	o.Selector = sel.String()
	o.fill()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery: %w", err)
	}
	return &kubeSource{client: cs, o: o}, nil
}

func (s *kubeSource) Run(ctx context.Context, update func([]Engine)) error {
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithNamespace(s.o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = s.o.Selector }))
	defer factory.Shutdown()
	pods := factory.Core().V1().Pods()
	inf := pods.Informer()
	// Managed fields are most of a pod's bytes and nothing here reads them.
	if err := inf.SetTransform(stripManagedFields); err != nil {
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	// Without this an RBAC or network problem would only reach klog and Run would wait
	// silently for a cache that never syncs.
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.o.Logger.Warn("kubernetes discovery: watching pods failed; retrying",
			"namespace", s.o.Namespace, "selector", s.o.Selector, "err", err)
	}); err != nil {
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	dirty := make(chan struct{}, 1)
	mark := func() {
		select {
		case dirty <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { mark() },
		UpdateFunc: func(any, any) { mark() },
		DeleteFunc: func(any) { mark() },
	}); err != nil {
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	factory.Start(ctx.Done())
	if res := factory.WaitForCacheSyncWithContext(ctx); res.Err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("kubernetes discovery: pod cache did not sync: %w", res.Err)
	}
	lister := pods.Lister().Pods(s.o.Namespace)
	// problems remembers what was last logged per pod, so a bad annotation is logged when
	// it appears or changes, not on every snapshot.
	problems := map[string]string{}
	snapshot := func() ([]Engine, error) {
		list, err := lister.List(labels.Everything()) // the cache holds only selected pods
		if err != nil {
			return nil, err
		}
		return s.engines(list, problems), nil
	}

	last, err := snapshot()
	if err != nil {
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	select { // the initial list is in the snapshot already
	case <-dirty:
	default:
	}
	update(cloneSnapshot(last))
	timer := time.NewTimer(0)
	<-timer.C
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-dirty:
		}
		timer.Reset(s.o.Debounce)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		// Drain before listing: a change after this point marks dirty again.
		select {
		case <-dirty:
		default:
		}
		next, err := snapshot()
		if err != nil {
			s.o.Logger.Error("kubernetes discovery: listing cached pods", "err", err)
			continue
		}
		if equalSnapshots(next, last) {
			continue // a status change that no Engine field reflects
		}
		last = next
		update(cloneSnapshot(last))
	}
}

func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil // tombstones (cache.DeletedFinalStateUnknown) pass through unchanged
}

func (s *kubeSource) engines(pods []*corev1.Pod, problems map[string]string) []Engine {
	out := make([]Engine, 0, len(pods))
	present := make(map[string]bool, len(pods))
	for _, p := range pods {
		present[p.Name] = true
		e, ok, found := EngineFromPod(p, s.o)
		msg := strings.Join(found, "; ")
		if msg != problems[p.Name] {
			if msg != "" {
				s.o.Logger.Warn("kubernetes discovery: engine pod", "pod", p.Name, "problems", msg, "listed", ok)
			}
			problems[p.Name] = msg
		}
		if ok {
			out = append(out, e)
		}
	}
	for name := range problems {
		if !present[name] {
			delete(problems, name)
		}
	}
	sortEngines(out)
	return out
}

// EngineFromPod is the pure pod -> Engine mapping behind NewKubernetes (o's empty fields
// take their defaults). ok is false for a pod that cannot be an engine (no IP yet,
// finished, no HTTP port); problems lists what was wrong, including annotations that were
// ignored on a pod that is still listed.
// EngineKindAnnotation names an engine pod's kind (vllm, sglang, trtllm); absent is the
// router's --engine-kind. The router runs one kind: a pod of another is refused (MixedKinds).
// The operator's constant for it belongs with the others in api/v1alpha1; until it is there the
// name is fixed here.
const EngineKindAnnotation = "serving.kvroute.io/engine-kind"

func EngineFromPod(p *corev1.Pod, o KubernetesOptions) (e Engine, ok bool, problems []string) {
	o.fill()
	if p.Status.PodIP == "" {
		return Engine{}, false, nil // scheduled or pending: nothing to connect to yet
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return Engine{}, false, nil
	}
	ip := p.Status.PodIP
	c := engineContainer(p, o.Container)
	port := o.Port
	if port == 0 && c != nil {
		for _, cp := range c.Ports {
			if cp.Name == "http" {
				port = int(cp.ContainerPort)
				break
			}
		}
	}
	if port == 0 {
		return Engine{}, false, []string{"no HTTP port: set the discovery port or name a container port \"http\""}
	}
	e = Engine{
		Name:        p.Name,
		URL:         "http://" + net.JoinHostPort(ip, strconv.Itoa(port)),
		Ready:       podReady(p),
		Incarnation: incarnation(p, c),
	}
	switch r := p.Labels[config.DefaultRoleLabel]; r {
	case "", config.RolePrefill, config.RoleDecode:
		e.Role = r
	default:
		problems = append(problems, fmt.Sprintf("label %s=%q is neither %q nor %q (routed as an engine that computes whole requests)",
			config.DefaultRoleLabel, r, config.RolePrefill, config.RoleDecode))
	}
	ann := p.Annotations
	events, err := endpointsFromPorts(ip, ann[o.EventsPortsAnnotation])
	if err != nil {
		problems = append(problems, fmt.Sprintf("annotation %s: %v (events ignored)", o.EventsPortsAnnotation, err))
	}
	e.Events = events
	replay, err := endpointsFromPorts(ip, ann[o.ReplayPortsAnnotation])
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("annotation %s: %v (replay ignored)", o.ReplayPortsAnnotation, err))
	case len(replay) > 0 && len(e.Events) > 0 && len(replay) != len(e.Events):
		problems = append(problems, fmt.Sprintf("annotation %s lists %d ports but %s lists %d (replay ignored)",
			o.ReplayPortsAnnotation, len(replay), o.EventsPortsAnnotation, len(e.Events)))
	default:
		e.Replay = replay
	}
	snap, err := endpointsFromPorts(ip, ann[o.SnapshotPortsAnnotation])
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("annotation %s: %v (snapshot ignored)", o.SnapshotPortsAnnotation, err))
	case len(snap) > 0 && len(e.Events) > 0 && len(snap) != len(e.Events):
		problems = append(problems, fmt.Sprintf("annotation %s lists %d ports but %s lists %d (snapshot ignored)",
			o.SnapshotPortsAnnotation, len(snap), o.EventsPortsAnnotation, len(e.Events)))
	case len(snap) > 0 && len(e.Replay) > 0 && len(snap) != len(e.Replay):
		problems = append(problems, fmt.Sprintf("annotation %s lists %d ports but %s lists %d (snapshot ignored)",
			o.SnapshotPortsAnnotation, len(snap), o.ReplayPortsAnnotation, len(e.Replay)))
	default:
		e.Snapshot = snap
	}
	if v, has := ann[o.BlockSizeAnnotation]; has {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || !blockkey.ValidBlockSize(int64(n)) {
			problems = append(problems, fmt.Sprintf("annotation %s=%q is not a block size in 1..%d (learned from events instead)", o.BlockSizeAnnotation, v, blockkey.MaxBlockSize))
		} else {
			e.BlockSize = n
		}
	}
	if v, has := ann[EngineKindAnnotation]; has {
		k, err := engine.Parse(v)
		if err != nil {
			// Kept as written: the fleet refuses an engine whose kind is not its own, and says so.
			problems = append(problems, fmt.Sprintf("annotation %s: %v (engine refused)", EngineKindAnnotation, err))
			k = engine.Kind(strings.TrimSpace(v))
		}
		e.Kind = k
	}
	e.Topic = strings.TrimSpace(ann[config.TopicAnnotation])
	if v, has := ann[o.WarmupUntilAnnotation]; has && strings.TrimSpace(v) != "" {
		t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Sprintf("annotation %s=%q is not an RFC 3339 time (no warm-up credit)", o.WarmupUntilAnnotation, v))
		} else {
			e.WarmupUntil = t
		}
	}
	return e, true, problems
}

func engineContainer(p *corev1.Pod, name string) *corev1.Container {
	for i := range p.Spec.Containers {
		if p.Spec.Containers[i].Name == name {
			return &p.Spec.Containers[i]
		}
	}
	if len(p.Spec.Containers) > 0 {
		return &p.Spec.Containers[0]
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false // terminating: let in-flight requests finish, send no new ones
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// incarnation is the pod UID and the engine container's restart count. The container's
// startedAt is left out on purpose: it disappears when the container dies and reappears
// with the next start, so it would signal one crash as two restarts, while restartCount
// moves once, when the old process (and its KV cache) is gone.
func incarnation(p *corev1.Pod, c *corev1.Container) string {
	restarts := int32(0)
	if c != nil {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == c.Name {
				restarts = cs.RestartCount
				break
			}
		}
	}
	return string(p.UID) + "/" + strconv.Itoa(int(restarts))
}

// endpointsFromPorts turns "5557,5558" into tcp://<ip>:5557, tcp://<ip>:5558; an empty item
// is a rank without that endpoint ("").
func endpointsFromPorts(ip, list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" {
		return nil, nil
	}
	items := strings.Split(list, ",")
	out := make([]string, len(items))
	some := false
	for r, it := range items {
		it = strings.TrimSpace(it)
		if it == "" {
			continue
		}
		if err := checkPort(it); err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
		out[r] = "tcp://" + net.JoinHostPort(ip, it)
		some = true
	}
	if !some {
		return nil, fmt.Errorf("%q lists no port", list)
	}
	return out, nil
}
