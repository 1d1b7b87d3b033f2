package cli

import (
	"context"
	"os"
	"sort"

	ctrl "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/kvroute/kvroute/router/app"
	"github.com/kvroute/kvroute/router/report"
)

// startReporter writes this router's degraded replicas, held requests and backlog into its
// KVRoutedModel's status (the config's report block, which the operator renders). The pod
// name is POD_NAME, else the hostname (a pod's hostname is its name). A router outside a cluster logs why and goes on.
func startReporter(ctx context.Context, st *settings, srv *app.Router) {
	pod := os.Getenv("POD_NAME")
	if pod == "" {
		pod, _ = os.Hostname()
	}
	rc, err := ctrl.GetConfig()
	if err != nil {
		st.logger.Warn("no Kubernetes config: index health is not reported to the KVRoutedModel", "err", err)
		return
	}
	r, err := report.New(rc, report.Options{Namespace: st.cfg.Report.Namespace, Model: st.cfg.Report.KVRoutedModel, Pod: pod,
		Source: func() []report.Degraded { return degradedReport(srv) }, Peers: peerNames(srv),
		Held: srv.Held, Backlog: srv.BacklogSeconds, Logger: st.logger})
	if err != nil {
		st.logger.Warn("index health is not reported to the KVRoutedModel", "err", err)
		return
	}
	go r.Run(ctx)
}

// degradedReport flattens the server's degraded replicas, replica then reason order.
func degradedReport(srv *app.Router) []report.Degraded {
	var out []report.Degraded
	for rep, sts := range srv.Degraded() {
		for _, s := range sts {
			out = append(out, report.Degraded{Replica: rep, Reason: string(s.Reason), Since: s.Since, Detail: s.Detail})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Replica != out[j].Replica {
			return out[i].Replica < out[j].Replica
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// peerNames lists the peers this router receives load from (nil without peers configured).
func peerNames(srv *app.Router) func() []string {
	if !srv.HasPeers() {
		return nil
	}
	return func() []string {
		var out []string
		for _, p := range srv.Peers() {
			out = append(out, p.Name)
		}
		return out // Peers is sorted by name
	}
}
