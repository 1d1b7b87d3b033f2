#!/usr/bin/env bash
# make demo, stage one: a local control plane (no kubelet), the KVRoutedModel CRD, the operator
# (bin/manager) against it, a sample model, and the children the operator creates.
# Stage two (steps 8-12): hack/podbacker backs the engine pods with vllm-sim processes on
# loopback IPs, kvrouter discovers them through the API server, a scale-up, trace slices.
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

# in_use HOST PORT: something accepts connections there (a wildcard listener counts too).
in_use() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
# pick_port NAME DEFAULT: the port in $NAME if the user set it (it must be free), else DEFAULT or
# the next free one above it.
pick_port() {
  local name=$1 p=$2
  if [ -n "${!name:-}" ]; then
    if in_use 127.0.0.1 "${!name}"; then
      echo "demo: $name=${!name} is in use on 127.0.0.1; pick another or leave $name unset" >&2
      return 1
    fi
    echo "${!name}"; return 0
  fi
  for ((i = 0; i < 200; i++, p++)); do
    if ! in_use 127.0.0.1 "$p"; then echo "$p"; return 0; fi
  done
  echo "demo: no free port from $2 up for $name" >&2
  return 1
}

step "0. ports"
ROUTER_PORT=$(pick_port ROUTER_PORT 18080)
ADMIN_PORT=$(pick_port ADMIN_PORT $((ROUTER_PORT == 19090 ? 19091 : 19090)))
[ "$ADMIN_PORT" != "$ROUTER_PORT" ] || ADMIN_PORT=$(ADMIN_PORT= pick_port ADMIN_PORT $((ROUTER_PORT + 1)))
echo "   kvrouter API 127.0.0.1:$ROUTER_PORT, admin 127.0.0.1:$ADMIN_PORT (set ROUTER_PORT / ADMIN_PORT to choose)"
# The engine pods listen on 127.0.0.2.. at the sample's ports (HTTP 8000, KV events 5557+r,
# replay 5600+r): a process listening on those ports on every address would take them.
for p in 8000 5557 5558 5600 5601; do
  if in_use 127.0.0.2 "$p"; then
    echo "demo: port $p is taken on every loopback address (something listens on 0.0.0.0:$p);" \
      "the engine pods need it on 127.0.0.2 and up: stop that process first" >&2
    exit 1
  fi
done

step "1. envtest binaries (kube-apiserver, etcd, kubectl; fetched, or built once, and cached)"
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
waitfor 30 "the CRD to be Established" "$KUBECTL" wait --for condition=established --timeout=10s crd/kvroutedmodels.serving.kvroute.io

step "4. start the operator (bin/manager)"
bin/manager --metrics-bind-address 0 --health-probe-bind-address 0 \
  --default-engine-image vllm/vllm-openai:v0.31.0 --default-router-image ghcr.io/kvroute/kvrouter:v0.1.0 \
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

# Stage two: the engine pods made real, kvrouter discovering them, a trace, a scale-up.
MODEL=${MODEL:-llama-70b}
ENGINE_SEL="app.kubernetes.io/part-of=kvroute,app.kubernetes.io/component=engine,serving.kvroute.io/model=$MODEL"
REPORT=${REPORT:-bench/demo-report}

step "8. pod backer: pods for the Deployments, one vllm-sim per pod on 127.0.0.x (no kubelet here)"
go build -o bin/podbacker ./hack/podbacker
mkdir -p "$WORK/pods"
bin/podbacker --namespace "$NS" --selector "app.kubernetes.io/part-of=kvroute,serving.kvroute.io/model=$MODEL" \
  --vllm-sim bin/vllm-sim --log-dir "$WORK/pods" \
  --sim-arg=--prefill-tokens-per-s=1250 --sim-arg=--num-gpu-blocks=2401 --sim-arg=--max-model-len=1048576 \
  --ready-url "kvrouter=http://127.0.0.1:$ROUTER_PORT/readyz" >"$WORK/podbacker.log" 2>&1 &
PIDS+=($!)
waitfor 60 "2 Ready engine pods" bash -c "[ \"\$('$KUBECTL' -n $NS get pods -l '$ENGINE_SEL' -o jsonpath='{range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\" \"}{end}')\" = 'True True ' ]"
"$KUBECTL" -n "$NS" get pods -l "$ENGINE_SEL" -o wide

step "9. kvrouter with Kubernetes discovery (--namespace $NS --selector ...), as the router Deployment runs it"
if [ ! -x bin/kvrouter ]; then
  echo "demo: bin/kvrouter is missing (cmd/kvrouter not built); stopping after the engines" >&2
  exit 1
fi
bin/kvrouter --namespace "$NS" --selector "$ENGINE_SEL" --listen "127.0.0.1:$ROUTER_PORT" \
  --admin-listen "127.0.0.1:$ADMIN_PORT" >"$WORK/kvrouter.log" 2>&1 &
PIDS+=($!)
waitfor 30 "kvrouter /readyz" curl -fsS "http://127.0.0.1:$ROUTER_PORT/readyz"
# Fetched whole, then shortened: piped into head, curl fails (23) with pipefail once the answer
# outgrows what head reads before it exits.
curl -fsS -o "$WORK/engines.json" "http://127.0.0.1:$ADMIN_PORT/debug/engines"
head -c 600 "$WORK/engines.json"; echo
"$KUBECTL" -n "$NS" wait --for=condition=Available --timeout=60s kvrm/"$MODEL" || true
"$KUBECTL" -n "$NS" get kvrm "$MODEL"

step "10. one request through kvrouter: which pod served it"
curl -sS -D - -o /dev/null "http://127.0.0.1:$ROUTER_PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"llama-3-70b","prompt":"Hello from the demo","max_tokens":4}' | grep -i '^x-kvroute' || true

step "11. scale-up through /scale: 2 -> 4; the new pods carry serving.kvroute.io/warmup-until"
"$KUBECTL" -n "$NS" patch kvrm "$MODEL" --subresource=scale --type=merge -p '{"spec":{"replicas":4}}'
waitfor 60 "4 Ready engine pods" bash -c "[ \"\$('$KUBECTL' -n $NS get pods -l '$ENGINE_SEL' -o jsonpath='{range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\" \"}{end}')\" = 'True True True True ' ]"
sleep 2
"$KUBECTL" -n "$NS" get pods -l "$ENGINE_SEL" \
  -o custom-columns='POD:.metadata.name,IP:.status.podIP,READY:.status.conditions[?(@.type=="Ready")].status,WARMUP-UNTIL:.metadata.annotations.serving\.kvroute\.io/warmup-until'
echo "   20 requests through kvrouter, engine per request:"
for i in $(seq 1 20); do
  curl -sS -D - -o /dev/null "http://127.0.0.1:$ROUTER_PORT/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"llama-3-70b\",\"prompt\":\"request $i of the scale-up\",\"max_tokens\":2}" | tr -d '\r' | sed -n 's/^x-kvroute-engine: //Ip'
done | sort | uniq -c | sed 's/^/   /'

step "12. two workloads through kvrouter policies side by side (kvbench replay: fresh sims per run)"
mkdir -p "$REPORT"
# The README's headline workloads (docs/results/*.json) with kv, round-robin and the peer
# emulation closest to kv there. Arrivals are the workload's own (open loop: --concurrency is
# far above what is ever in flight, so the "held" count stays 0), below the engines' saturation.
echo "   where reuse pays: tenants, each tenant's requests sharing a long prefix"
bin/kvbench replay --regime tenants --replicas 4 --seeds 3 --concurrency 256 \
  --policies kv,round-robin,sglang-cache-aware --report "$REPORT/tenants"
echo "   where there is nothing to win: every prompt unique; kv should route as well as round-robin"
bin/kvbench replay --regime no-reuse --rate 8 --duration 15s --replicas 4 --seeds 3 --concurrency 256 \
  --policies kv,round-robin,sglang-cache-aware --report "$REPORT/no-reuse"
echo "   reports: $REPORT/tenants/index.html $REPORT/no-reuse/index.html"

step "demo: done"
