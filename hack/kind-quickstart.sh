#!/usr/bin/env bash
# kind-quickstart.sh: kvroute on a kind cluster with the simulator as the engine, no GPU needed.
# The steps of docs/quickstart-kind.md, run in order, each checked before the next:
#   1. a kind cluster (reused when it exists)       5. port-forward to the router
#   2. make images, kind load image-archive          6. completions through the router
#   3. dist/install.yaml, the manager rolled out     7. /debug/engines: every rank's stream exact
#   4. config/samples/..._sim.yaml, Ready
# Needs kind (with Docker or Podman), kubectl, curl, go, and Debian's apt for the image runtime
# layer (hack/images.sh). Env: CLUSTER (kvroute), SKIP_IMAGES=1 to load bin/images as they are,
# LOCAL_PORT (18000) and ADMIN_PORT (19090) for the port-forward, KEEP=1 to leave it running.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${CLUSTER:-kvroute}
NS=llm
MODEL=qwen-sim
SERVED=qwen3-0-6b
SAMPLE=config/samples/serving_v1alpha1_kvroutedmodel_sim.yaml
LOCAL_PORT=${LOCAL_PORT:-18000}
ADMIN_PORT=${ADMIN_PORT:-19090}
K=(kubectl --context "kind-$CLUSTER")

step() { printf '\n== %s\n' "$*"; }
die() { echo "kind-quickstart: $*" >&2; exit 1; }
for tool in kind kubectl curl go; do
	command -v "$tool" >/dev/null || die "$tool is not installed"
done

step "1. kind cluster $CLUSTER"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
	echo "reusing kind cluster $CLUSTER"
else
	kind create cluster --name "$CLUSTER" --wait 120s
fi

step "2. images: bin/images/{manager,kvrouter,vllm-sim}.tar, loaded into the nodes"
if [ -z "${SKIP_IMAGES:-}" ]; then
	make images IMAGES="manager kvrouter vllm-sim"
fi
for image in manager kvrouter vllm-sim; do
	[ -f "bin/images/$image.tar" ] || die "bin/images/$image.tar is missing (run without SKIP_IMAGES)"
	kind load image-archive "bin/images/$image.tar" --name "$CLUSTER"
done

step "3. install: CRD, manager, RBAC (dist/install.yaml)"
"${K[@]}" apply --server-side -f dist/install.yaml
"${K[@]}" -n kvroute-system rollout status deploy/kvroute-controller-manager --timeout=180s

step "4. a KVRoutedModel on the simulator: $SAMPLE"
"${K[@]}" create namespace "$NS" --dry-run=client -o yaml | "${K[@]}" apply -f -
"${K[@]}" apply -f "$SAMPLE"
"${K[@]}" -n "$NS" wait "kvrm/$MODEL" --for=condition=Ready --timeout=300s
"${K[@]}" -n "$NS" get kvrm,pods -o wide
echo "the engine command, as rendered and as run by vllm-sim:"
"${K[@]}" -n "$NS" get deploy "$MODEL-engine" -o jsonpath='{.spec.template.spec.containers[0].command} {.spec.template.spec.containers[0].args}{"\n"}'

step "5. port-forward svc/$MODEL-router: API on 127.0.0.1:$LOCAL_PORT, admin on 127.0.0.1:$ADMIN_PORT"
"${K[@]}" -n "$NS" port-forward "svc/$MODEL-router" "$LOCAL_PORT:8000" "$ADMIN_PORT:9090" >/dev/null 2>&1 &
PF=$!
if [ -z "${KEEP:-}" ]; then
	trap 'kill "$PF" 2>/dev/null || true' EXIT
fi
for _ in $(seq 1 60); do
	curl -fsS -o /dev/null "http://127.0.0.1:$LOCAL_PORT/readyz" 2>/dev/null && break
	sleep 1
done
curl -fsS -o /dev/null "http://127.0.0.1:$LOCAL_PORT/readyz" || die "the router does not answer on 127.0.0.1:$LOCAL_PORT"

step "6. completions through the router (a shared prefix, so the second and later hit the cache)"
prefix="You are a helpful assistant. Answer in one short sentence, and cite nothing."
for i in 1 2 3 4 5 6; do
	curl -fsS -D - -o /dev/null "http://127.0.0.1:$LOCAL_PORT/v1/completions" -H 'Content-Type: application/json' \
		-d "{\"model\":\"$SERVED\",\"prompt\":\"$prefix Question $i: what is a KV cache?\",\"max_tokens\":8}" |
		grep -i '^x-kvroute' || true
done

step "7. /debug/engines: two pods x two DP ranks, every event stream exact"
streams=""
for _ in $(seq 1 60); do
	streams=$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/debug/engines" | grep -o '"stream":"[a-z]*"' | sort | uniq -c || true)
	if [ "$(printf '%s\n' "$streams" | grep -c .)" = 1 ] && printf '%s\n' "$streams" | grep -q '4 "stream":"exact"'; then
		break
	fi
	sleep 1
done
printf '%s\n' "$streams"
printf '%s\n' "$streams" | grep -q '4 "stream":"exact"' || die "not every rank's stream is exact yet"
echo
echo "kind-quickstart: done. Try: curl -s 127.0.0.1:$ADMIN_PORT/debug/engines"
if [ -n "${KEEP:-}" ]; then
	echo "port-forward left running (pid $PF); kind delete cluster --name $CLUSTER removes everything"
fi
