package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/sim/vllmcli"
)

// Backer stands in for the kubelet (and the Deployment and garbage collectors, which a bare
// kube-apiserver lacks too) for the Deployments it selects: pods are created from the template,
// each gets a loopback IP and a process, and is marked Ready once the process answers.
type Backer struct {
	Client    client.Client
	Namespace string
	Selector  labels.Selector
	// SimBin is the program run for a first container whose command is vllm (the engine): the
	// rendered command runs as is with vllm-sim in vllm's place. A Deployment whose first
	// container runs something else gets pods marked Ready when ReadyURL (by container name)
	// answers (the router the caller runs itself); with no ReadyURL its pods stay not Ready.
	SimBin   string
	SimArgs  []string // the simulator's own flags (timing) for every engine, through VLLM_SIM_ARGS
	ReadyURL map[string]string
	LogDir   string
	// FirstIP is the first pod IP handed out (127.0.0.2); each new pod takes the next free one.
	FirstIP net.IP
	Log     *slog.Logger
	// Now is the clock for condition times (tests may fix it).
	Now func() time.Time

	mu    sync.Mutex
	procs map[string]*podProc // by pod name
	ips   map[string]string   // pod name -> IP
}

type podProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	url  string // health URL
}

// Run reconciles every interval until ctx ends, then stops every process it started.
func (b *Backer) Run(ctx context.Context, interval time.Duration) error {
	defer b.StopAll()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := b.Reconcile(ctx); err != nil && ctx.Err() == nil {
			b.Log.Warn("reconcile", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Reconcile makes one pass: the pods of every selected Deployment match its replicas, their
// processes run, their status says what the processes answer, and the Deployment's status
// counts them (there is no Deployment controller to do it).
func (b *Backer) Reconcile(ctx context.Context) error {
	b.init()
	if err := b.ensureServiceAccount(ctx); err != nil {
		return err
	}
	var deps appsv1.DeploymentList
	if err := b.Client.List(ctx, &deps, client.InNamespace(b.Namespace), client.MatchingLabelsSelector{Selector: b.Selector}); err != nil {
		return err
	}
	var pods corev1.PodList
	if err := b.Client.List(ctx, &pods, client.InNamespace(b.Namespace), client.HasLabels{backedLabel}); err != nil {
		return err
	}
	owned := map[string][]*corev1.Pod{}
	alive := map[string]bool{}
	for i := range deps.Items {
		alive[deps.Items[i].Name] = true
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		dep := p.Labels[backedLabel]
		if !alive[dep] { // owner gone: no garbage collector here, so clean up ourselves
			b.deletePod(ctx, p)
			continue
		}
		owned[dep] = append(owned[dep], p)
	}
	var errs []string
	for i := range deps.Items {
		if err := b.reconcileDeployment(ctx, &deps.Items[i], owned[deps.Items[i].Name]); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", deps.Items[i].Name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// backedLabel marks the pods the backer made, with the Deployment's name as the value.
const backedLabel = "podbacker.kvroute.io/deployment"

func (b *Backer) init() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.procs == nil {
		b.procs, b.ips = map[string]*podProc{}, map[string]string{}
	}
	if b.Now == nil {
		b.Now = time.Now
	}
	if b.Log == nil {
		b.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if b.FirstIP == nil {
		b.FirstIP = net.IPv4(127, 0, 0, 2)
	}
}

// ensureServiceAccount creates the namespace's "default" ServiceAccount, which the
// ServiceAccount admission plugin wants for every pod and which no controller-manager makes here.
func (b *Backer) ensureServiceAccount(ctx context.Context) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: b.Namespace}}
	if err := b.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service account: %w", err)
	}
	return nil
}

func (b *Backer) reconcileDeployment(ctx context.Context, d *appsv1.Deployment, pods []*corev1.Pod) error {
	want := 1
	if d.Spec.Replicas != nil {
		want = int(*d.Spec.Replicas)
	}
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) || pods[i].Name < pods[j].Name
	})
	var live []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	// Scale down newest first, as a ReplicaSet prefers the youngest pods.
	for len(live) > want {
		b.deletePod(ctx, live[len(live)-1])
		live = live[:len(live)-1]
	}
	for len(live) < want {
		p, err := b.createPod(ctx, d, live)
		if err != nil {
			return err
		}
		live = append(live, p)
	}
	ready := 0
	for _, p := range live {
		ok, err := b.syncPod(ctx, d, p)
		if err != nil {
			return err
		}
		if ok {
			ready++
		}
	}
	st := appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: int32(len(live)), UpdatedReplicas: int32(len(live)),
		ReadyReplicas: int32(ready), AvailableReplicas: int32(ready), UnavailableReplicas: int32(len(live) - ready)}
	if d.Status.ObservedGeneration == st.ObservedGeneration && d.Status.Replicas == st.Replicas && d.Status.UpdatedReplicas == st.UpdatedReplicas &&
		d.Status.ReadyReplicas == st.ReadyReplicas && d.Status.AvailableReplicas == st.AvailableReplicas {
		return nil
	}
	cond := corev1.ConditionFalse
	if ready >= want {
		cond = corev1.ConditionTrue
	}
	now := metav1.NewTime(b.Now())
	st.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: cond, Reason: "PodBacker",
		Message: fmt.Sprintf("%d of %d pods Ready (podbacker)", ready, want), LastUpdateTime: now, LastTransitionTime: now}}
	d.Status = st
	return b.Client.Status().Update(ctx, d)
}

func (b *Backer) createPod(ctx context.Context, d *appsv1.Deployment, existing []*corev1.Pod) (*corev1.Pod, error) {
	taken := map[string]bool{}
	for _, p := range existing {
		taken[p.Name] = true
	}
	name := ""
	for k := 0; ; k++ {
		if name = fmt.Sprintf("%s-%d", d.Name, k); !taken[name] {
			break
		}
	}
	tpl := d.Spec.Template.DeepCopy()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.Namespace, Labels: tpl.Labels, Annotations: tpl.Annotations,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
		Spec: tpl.Spec}
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[backedLabel] = d.Name
	p.Spec.NodeName = "podbacker"
	if err := b.Client.Create(ctx, p); err != nil {
		if apierrors.IsAlreadyExists(err) { // a pod of that name is still being deleted; next pass
			return nil, fmt.Errorf("pod %s: %w", name, err)
		}
		return nil, fmt.Errorf("create pod %s: %w", name, err)
	}
	b.Log.Info("pod created", "pod", name)
	return p, nil
}

// syncPod starts the pod's process if needed and writes its status; it reports Ready.
func (b *Backer) syncPod(ctx context.Context, d *appsv1.Deployment, p *corev1.Pod) (bool, error) {
	ip := b.ipFor(p.Name)
	healthURL, err := b.ensureProcess(ctx, p, ip)
	if err != nil {
		return false, err
	}
	ready := healthURL != "" && httpOK(healthURL)
	cur := podIsReady(p)
	if p.Status.PodIP == ip && p.Status.Phase == corev1.PodRunning && cur == ready {
		return ready, nil
	}
	now := metav1.NewTime(b.Now())
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	c := p.Spec.Containers[0]
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: "127.0.0.1", PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
			// lastTransitionTime now: the operator's warm-up window starts when the pod turns Ready.
			{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, Ready: ready, Started: &ready,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}
	if err := b.Client.Status().Update(ctx, p); err != nil {
		return false, fmt.Errorf("pod %s status: %w", p.Name, err)
	}
	if ready {
		b.Log.Info("pod Ready", "pod", p.Name, "ip", ip)
	}
	return ready, nil
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ipFor hands out loopback addresses: the lowest one from FirstIP not held by another pod.
func (b *Backer) ipFor(pod string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ip, ok := b.ips[pod]; ok {
		return ip
	}
	used := map[string]bool{}
	for _, ip := range b.ips {
		used[ip] = true
	}
	base := b.FirstIP.To4()
	for k := 0; k < 250; k++ {
		ip := net.IPv4(base[0], base[1], base[2], base[3]+byte(k)).String()
		if !used[ip] {
			b.ips[pod] = ip
			return ip
		}
	}
	return "" // more than 250 pods: not a demo any more
}

// ensureProcess starts the pod's process once and returns the URL that says it is healthy.
func (b *Backer) ensureProcess(ctx context.Context, p *corev1.Pod, ip string) (string, error) {
	if ip == "" {
		return "", fmt.Errorf("pod %s: no loopback IP left", p.Name)
	}
	c := p.Spec.Containers[0]
	if b.SimBin == "" || len(c.Command) == 0 || c.Command[0] != "vllm" {
		return b.ReadyURL[c.Name], nil
	}
	b.mu.Lock()
	if pp, ok := b.procs[p.Name]; ok {
		select {
		case <-pp.done: // exited: start again below (a container restart)
		default:
			b.mu.Unlock()
			return pp.url, nil
		}
	}
	b.mu.Unlock()
	cmd, url := b.engineCommand(ctx, p, ip)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.LogDir != "" {
		f, err := os.Create(filepath.Join(b.LogDir, p.Name+".log"))
		if err != nil {
			return "", err
		}
		cmd.Stdout, cmd.Stderr = f, f
		defer f.Close()
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("pod %s: start vllm-sim: %w", p.Name, err)
	}
	pp := &podProc{cmd: cmd, done: make(chan struct{}), url: url}
	go func() { _ = cmd.Wait(); close(pp.done) }()
	b.procs[p.Name] = pp
	b.Log.Info("vllm-sim started", "pod", p.Name, "ip", ip, "args", strings.Join(cmd.Args, " "))
	return pp.url, nil
}

// engineCommand is the engine container's command and args exactly as rendered, the program
// vllm being vllm-sim (invoked as vllm, so it reads vLLM's command line), with the container's
// environment as the kubelet would resolve it on a pod with this IP. Two variables adapt it to
// one host: VLLM_SIM_WILDCARD_HOST=ip makes the sim bind what a pod binds on every interface
// (HTTP, tcp://*:PORT) on the pod's own loopback address instead, so pods share the rendered
// ports without colliding; VLLM_SIM_ARGS gets SimArgs (timing) after the container's own.
// It also returns the health URL: the container's http port on ip.
func (b *Backer) engineCommand(ctx context.Context, p *corev1.Pod, ip string) (*exec.Cmd, string) {
	c := p.Spec.Containers[0]
	env := b.containerEnv(ctx, p, c, ip)
	simArgs := strings.TrimSpace(lookupEnv(env, vllmcli.SimArgsEnv) + " " + strings.Join(b.SimArgs, " "))
	env = append(env, vllmcli.WildcardHostEnv+"="+ip, vllmcli.SimArgsEnv+"="+simArgs)
	cmd := exec.Command(b.SimBin, append(slices.Clone(c.Command[1:]), c.Args...)...)
	cmd.Args[0] = c.Command[0]
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	port := int32(8000)
	for _, cp := range c.Ports {
		if cp.Name == "http" {
			port = cp.ContainerPort
		}
	}
	return cmd, "http://" + net.JoinHostPort(ip, strconv.Itoa(int(port))) + "/health"
}

// containerEnv resolves the container's envFrom and env as the kubelet does: envFrom first,
// env after it (and over it), $(VAR) in values expanded from the variables before them, the
// downward API fields a pod here has. A Secret or ConfigMap that is missing (the demo does not
// create the model's token Secret) leaves its variables unset, with a warning, where the
// kubelet would not start the container.
func (b *Backer) containerEnv(ctx context.Context, p *corev1.Pod, c corev1.Container, ip string) []string {
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, from := range c.EnvFrom {
		data, what := b.envSource(ctx, p.Namespace, from)
		if data == nil && what != "" {
			b.Log.Warn("envFrom source missing: its variables are unset", "pod", p.Name, "source", what)
		}
		for k, v := range data {
			set(from.Prefix+k, v)
		}
	}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, vllmcli.Expand(e.Value, lookup))
			continue
		}
		v, ok, err := b.envValue(ctx, p, e.ValueFrom, ip)
		if err != nil {
			b.Log.Warn("env variable unset", "pod", p.Name, "var", e.Name, "err", err)
			continue
		}
		if ok {
			set(e.Name, v)
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vars[k])
	}
	return out
}

// envValue is one valueFrom: (value, set, error).
func (b *Backer) envValue(ctx context.Context, p *corev1.Pod, from *corev1.EnvVarSource, ip string) (string, bool, error) {
	switch {
	case from.FieldRef != nil:
		switch from.FieldRef.FieldPath {
		case "status.podIP", "status.podIPs":
			return ip, true, nil
		case "status.hostIP", "status.hostIPs":
			return "127.0.0.1", true, nil
		case "metadata.name":
			return p.Name, true, nil
		case "metadata.namespace":
			return p.Namespace, true, nil
		case "spec.nodeName":
			return p.Spec.NodeName, true, nil
		case "spec.serviceAccountName":
			return p.Spec.ServiceAccountName, true, nil
		}
		return "", false, fmt.Errorf("field %s is not backed here", from.FieldRef.FieldPath)
	case from.SecretKeyRef != nil:
		r := from.SecretKeyRef
		var sec corev1.Secret
		if err := b.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: r.Name}, &sec); err != nil {
			if apierrors.IsNotFound(err) && r.Optional != nil && *r.Optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %s: %w", r.Name, err)
		}
		v, ok := sec.Data[r.Key]
		if !ok && (r.Optional == nil || !*r.Optional) {
			return "", false, fmt.Errorf("secret %s has no key %s", r.Name, r.Key)
		}
		return string(v), ok, nil
	case from.ConfigMapKeyRef != nil:
		r := from.ConfigMapKeyRef
		var cm corev1.ConfigMap
		if err := b.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: r.Name}, &cm); err != nil {
			if apierrors.IsNotFound(err) && r.Optional != nil && *r.Optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %s: %w", r.Name, err)
		}
		v, ok := cm.Data[r.Key]
		if !ok && (r.Optional == nil || !*r.Optional) {
			return "", false, fmt.Errorf("configmap %s has no key %s", r.Name, r.Key)
		}
		return v, ok, nil
	}
	return "", false, fmt.Errorf("a resourceFieldRef is not backed here")
}

// envSource reads one envFrom source; what names it when it is required and missing.
func (b *Backer) envSource(ctx context.Context, ns string, from corev1.EnvFromSource) (data map[string]string, what string) {
	switch {
	case from.SecretRef != nil:
		var sec corev1.Secret
		if err := b.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: from.SecretRef.Name}, &sec); err != nil {
			if from.SecretRef.Optional != nil && *from.SecretRef.Optional {
				return nil, ""
			}
			return nil, "secret " + from.SecretRef.Name
		}
		data = map[string]string{}
		for k, v := range sec.Data {
			data[k] = string(v)
		}
		return data, ""
	case from.ConfigMapRef != nil:
		var cm corev1.ConfigMap
		if err := b.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: from.ConfigMapRef.Name}, &cm); err != nil {
			if from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
				return nil, ""
			}
			return nil, "configmap " + from.ConfigMapRef.Name
		}
		return cm.Data, ""
	}
	return nil, ""
}

func lookupEnv(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, val, _ := strings.Cut(kv, "="); k == name {
			v = val
		}
	}
	return v
}

func (b *Backer) deletePod(ctx context.Context, p *corev1.Pod) {
	b.stopProcess(p.Name)
	zero := int64(0)
	if err := b.Client.Delete(ctx, p, &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		b.Log.Warn("delete pod", "pod", p.Name, "err", err)
		return
	}
	b.mu.Lock()
	delete(b.ips, p.Name)
	b.mu.Unlock()
	b.Log.Info("pod deleted", "pod", p.Name)
}

func (b *Backer) stopProcess(name string) {
	b.mu.Lock()
	pp := b.procs[name]
	delete(b.procs, name)
	b.mu.Unlock()
	if pp == nil {
		return
	}
	_ = pp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pp.done:
	case <-time.After(2 * time.Second):
		_ = pp.cmd.Process.Kill()
		<-pp.done
	}
}

// StopAll stops every process the backer started.
func (b *Backer) StopAll() {
	b.mu.Lock()
	var names []string
	for n := range b.procs {
		names = append(names, n)
	}
	b.mu.Unlock()
	for _, n := range names {
		b.stopProcess(n)
	}
}

var probe = &http.Client{Timeout: 500 * time.Millisecond}

func httpOK(url string) bool {
	resp, err := probe.Get(url)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body) // drained so the connection is reused; the status is the answer
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
