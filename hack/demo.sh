#!/usr/bin/env bash
# make demo, stage one: a local control plane (no kubelet), the KVRoutedModel CRD, the operator
# (bin/manager) against it, a sample model, and the children the operator creates.
# Later stages (vllm-sim engines, kvrouter, a trace) add steps below.
# Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

# The DP-2 x TP-2 sample, and the HPA one (its HPA reports Degraded/MetricsAPIUnavailable:
# there is no custom metrics adapter here).
SAMPLES=${SAMPLES:-config/samples/serving_v1alpha1_kvroutedmodel_dp2tp2.yaml config/samples/serving_v1alpha1_kvroutedmodel_hpa.yaml}
NS=llm
WORK=$(mktemp -d)
PIDS=()

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
cleanup() {
  local rc=$?
  step "cleaning up"
  # Stop in reverse order of starting: the operator before the control plane.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[$i]}" 2>/dev/null || true
    wait "${PIDS[$i]}" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ]; then
    for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f (tail)"; tail -n 20 "$f"; }; done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# waitfor SECONDS DESCRIPTION CMD...: retry CMD until it succeeds; give up at once if a
# process this script started has died.
waitfor() {
  local secs=$1 what=$2; shift 2
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    for p in "${PIDS[@]}"; do
      kill -0 "$p" 2>/dev/null || { echo "demo: a background process ($p) exited while waiting for $what" >&2; return 1; }
    done
    sleep 0.2
  done
  echo "demo: timed out after ${secs}s waiting for $what" >&2
  return 1
}

step "1. envtest binaries (kube-apiserver, etcd, kubectl; built once and cached)"
ASSETS=$(hack/envtest-assets.sh)
KUBECTL="$ASSETS/kubectl"
echo "$ASSETS"
[ -x bin/manager ] || { echo "demo: bin/manager is missing; run make demo (it builds first)" >&2; exit 1; }
go build -o bin/localcp ./hack/localcp

step "2. local control plane"
export KUBECONFIG="$WORK/kubeconfig"
bin/localcp --assets "$ASSETS" --kubeconfig "$KUBECONFIG" >"$WORK/localcp.log" 2>&1 &
PIDS+=($!)
waitfor 60 "the control plane" test -s "$KUBECONFIG"
waitfor 30 "the apiserver's /readyz" "$KUBECTL" get --raw /readyz
("$KUBECTL" version 2>/dev/null || true) | sed "s/^/   /"

step "3. install the KVRoutedModel CRD"
"$KUBECTL" apply --server-side -f config/crd/bases
"$KUBECTL" wait --for condition=established --timeout=30s crd/kvroutedmodels.serving.kvroute.io

step "4. start the operator (bin/manager)"
bin/manager --metrics-bind-address 0 --health-probe-bind-address 0 \
  --default-engine-image vllm/vllm-openai:latest --default-router-image ghcr.io/kvroute/kvrouter:latest \
  >"$WORK/manager.log" 2>&1 &
PIDS+=($!)
echo "   manager pid ${PIDS[-1]}, log $WORK/manager.log"

step "5. apply the samples: $SAMPLES"
"$KUBECTL" create namespace "$NS"
NAMES=()
for f in $SAMPLES; do
  "$KUBECTL" apply -f "$f"
  NAMES+=("$("$KUBECTL" get -f "$f" -o jsonpath='{.metadata.name}')")
done

step "6. wait for the children and the first status"
for name in "${NAMES[@]}"; do
  for obj in deploy/"$name"-engine deploy/"$name"-router svc/"$name"-engine svc/"$name"-router networkpolicy/"$name"-engine; do
    waitfor 30 "$obj" "$KUBECTL" -n "$NS" get "$obj"
    echo "   $obj"
  done
  "$KUBECTL" -n "$NS" wait --for=jsonpath='{.status.observedGeneration}'=1 --timeout=30s kvrm/"$name"
done

step "7. what the operator made (no kubelet here: Deployments stay at 0 ready)"
"$KUBECTL" -n "$NS" get kvrm
echo
"$KUBECTL" -n "$NS" get deploy,svc,hpa,networkpolicy -l app.kubernetes.io/part-of=kvroute
echo
for name in "${NAMES[@]}"; do
  echo "$name:"
  "$KUBECTL" -n "$NS" get kvrm "$name" -o jsonpath='{range .status.conditions[*]}   {.type}={.status} {.reason}: {.message}{"\n"}{end}'
done

step "demo: done"
