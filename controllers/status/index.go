package status

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/api/v1alpha1"
)

// ReportTTL is how long a router's report counts without being confirmed. Routers confirm
// theirs every 20 s (router/report.DefaultHeartbeat, and at once on a change), so two missed
// writes in a row are tolerated; the reconciler looks again at the expiry (NextReportExpiry),
// so a router that stops shows as IndexHealthy=Unknown within 60 s of its last write (issue
// 19). Before, 2 minutes with a write a minute.
const ReportTTL = 50 * time.Second

// keyReasons are the degraded reasons that mean a replica's keys may be wrong: they make the
// model Degraded (IndexUnhealthy). informational ones are known limits, shown but healthy.
var (
	keyReasons           = map[string]bool{"undecodable": true, "unchained": true, "hash-mismatch": true, "keys-wrong": true}
	informationalReasons = map[string]bool{"multimodal-unkeyed": true, "hybrid-groups-skipped": true, "partial": true}
)

// maxIndexMessage bounds the condition message (the API allows 32768).
const maxIndexMessage = 2048

// freshReports are the reports confirmed within ReportTTL from router pods that still exist
// (routerPods nil: not known, every pod counts).
func freshReports(o Observed) []v1alpha1.RouterReport {
	var out []v1alpha1.RouterReport
	for _, r := range o.Model.Status.RouterReports {
		if o.Now.Sub(r.ObservedAt.Time) > ReportTTL {
			continue
		}
		if o.RouterPods != nil && !o.RouterPods[r.Pod] {
			continue
		}
		out = append(out, r)
	}
	return out
}

// keptReports are the reports status keeps: every fresh one, and stale ones whose pod still
// exists (it may report again). Reports of pods gone and silent past ReportTTL are dropped.
func keptReports(o Observed) []v1alpha1.RouterReport {
	var out []v1alpha1.RouterReport
	for _, r := range o.Model.Status.RouterReports {
		gone := o.RouterPods != nil && !o.RouterPods[r.Pod]
		if gone && o.Now.Sub(r.ObservedAt.Time) > ReportTTL {
			continue
		}
		out = append(out, r)
	}
	return out
}

// indexCondition aggregates the fresh router reports into IndexHealthy, and returns the
// Degraded problem when a replica's keys may be wrong (nil otherwise).
func indexCondition(o Observed) (metav1.Condition, *Problem) {
	fresh := freshReports(o)
	if len(fresh) == 0 {
		c := cond(v1alpha1.ConditionIndexHealthy, false, v1alpha1.ReasonNoRouterReport,
			fmt.Sprintf("no router has reported on the index in the last %s", ReportTTL))
		c.Status = metav1.ConditionUnknown
		return c, nil
	}
	type finding struct {
		reason, detail string
		routers        map[string]bool
	}
	byReplica := map[string]map[string]*finding{}
	// Reports in pod order, so the detail shown (the first router's) does not depend on the
	// order of the list: with several routers the message stays the same from pass to pass.
	sort.Slice(fresh, func(i, j int) bool { return fresh[i].Pod < fresh[j].Pod })
	for _, r := range fresh {
		for _, d := range r.Degraded {
			m := byReplica[d.Replica]
			if m == nil {
				m = map[string]*finding{}
				byReplica[d.Replica] = m
			}
			f := m[d.Reason]
			if f == nil {
				f = &finding{reason: d.Reason, detail: d.Detail, routers: map[string]bool{}}
				m[d.Reason] = f
			}
			f.routers[r.Pod] = true
		}
	}
	replicas := make([]string, 0, len(byReplica))
	for r := range byReplica {
		replicas = append(replicas, r)
	}
	sort.Strings(replicas)
	var unhealthy, keyWrong, info []string
	for _, rep := range replicas {
		reasons := make([]string, 0, len(byReplica[rep]))
		for r := range byReplica[rep] {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		for _, reason := range reasons {
			f := byReplica[rep][reason]
			line := fmt.Sprintf("%s %s (%d of %d routers): %s", rep, reason, len(f.routers), len(fresh), f.detail)
			switch {
			case informationalReasons[reason]:
				info = append(info, line)
			default:
				unhealthy = append(unhealthy, line)
				if keyReasons[reason] {
					keyWrong = append(keyWrong, line)
				}
			}
		}
	}
	if len(unhealthy) == 0 {
		msg := fmt.Sprintf("%d router(s) report every replica's index healthy", len(fresh))
		if len(info) > 0 {
			msg += "; known limits: " + strings.Join(info, "; ")
		}
		return cond(v1alpha1.ConditionIndexHealthy, true, v1alpha1.ReasonIndexHealthy, clip(msg)), nil
	}
	c := cond(v1alpha1.ConditionIndexHealthy, false, v1alpha1.ReasonIndexUnhealthy, clip(strings.Join(unhealthy, "; ")))
	if len(keyWrong) == 0 {
		return c, nil
	}
	return c, &Problem{Reason: v1alpha1.ReasonIndexUnhealthy,
		Message: clip("replicas whose KV index keys may be wrong (routing continues by load where needed): " + strings.Join(keyWrong, "; "))}
}

// findingLine matches one finding of an unhealthy IndexHealthy message as indexCondition
// writes it: "<replica> <reason> (<k> of <n> routers): <detail>".
var findingLine = regexp.MustCompile(`^(\S+ \S+) \(\d+ of \d+ routers\): `)

// indexFindings is the set of "replica reason" an unhealthy IndexHealthy names (details and
// router counts, which change at every report, left out).
func indexFindings(c metav1.Condition) map[string]bool {
	out := map[string]bool{}
	for _, part := range strings.Split(c.Message, "; ") {
		if m := findingLine.FindStringSubmatch(part); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// indexFindingsChanged reports whether two unhealthy IndexHealthy conditions name different
// replicas or reasons.
func indexFindingsChanged(prev, next metav1.Condition) bool {
	if next.Type != v1alpha1.ConditionIndexHealthy || next.Status != metav1.ConditionFalse {
		return false
	}
	a, b := indexFindings(prev), indexFindings(next)
	if len(a) != len(b) {
		return true
	}
	for k := range b {
		if !a[k] {
			return true
		}
	}
	return false
}

func clip(s string) string {
	if len(s) <= maxIndexMessage {
		return s
	}
	return s[:maxIndexMessage-3] + "..."
}

// NextReportExpiry is how long until the soonest fresh report goes stale (0: none fresh), so
// the reconciler looks again when IndexHealthy may change without any write.
func NextReportExpiry(m *v1alpha1.KVRoutedModel, now time.Time) time.Duration {
	var next time.Duration
	for _, r := range m.Status.RouterReports {
		left := r.ObservedAt.Add(ReportTTL).Sub(now)
		if left > 0 && (next == 0 || left < next) {
			next = left
		}
	}
	if next == 0 {
		return 0
	}
	return next + time.Second
}

// peersConnected says whether every fresh router report lists every other reporting router
// among its peers (several router replicas sharing their load), and names the pairs that do not.
func peersConnected(o Observed) (bool, string) {
	fresh := freshReports(o)
	if len(fresh) < 2 {
		return false, fmt.Sprintf("%d router(s) reporting; their peers are known once two report", len(fresh))
	}
	sort.Slice(fresh, func(i, j int) bool { return fresh[i].Pod < fresh[j].Pod })
	var missing []string
	for _, r := range fresh {
		sees := map[string]bool{}
		for _, p := range r.Peers {
			sees[p] = true
		}
		for _, other := range fresh {
			if other.Pod != r.Pod && !sees[other.Pod] {
				missing = append(missing, r.Pod+" does not see "+other.Pod)
			}
		}
	}
	if len(missing) == 0 {
		return true, fmt.Sprintf("%d routers see each other", len(fresh))
	}
	msg := strings.Join(missing, "; ")
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	return false, msg
}
