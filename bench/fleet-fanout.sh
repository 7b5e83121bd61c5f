#!/usr/bin/env bash
# Benchmark: bytes the Hub serves to get one model onto a fleet of 3 Sparks, over the model's size (issue 5's
# goal: <= 1.05, each byte crossing the internet once). Three simulated Sparks (molecule scenario "fanout"), each
# running the stand-in Hub on its loopback; fanout-1 is model_weights_origin, the two others copy from it. Also
# prints the weights stage's wall time and checks that all three hold the same bytes. Asserts nothing else.
#
#   bash bench/fleet-fanout.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tests/run-all.sh setup >/dev/null
export PATH="$root/.venv/bin:$PATH" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1
log=$(mktemp)
trap 'molecule destroy -s fanout >/dev/null 2>&1; rm -f "$log"' EXIT

molecule destroy -s fanout >/dev/null 2>&1
molecule create -s fanout >/dev/null
molecule prepare -s fanout >/dev/null

started=$EPOCHREALTIME
molecule converge -s fanout >"$log" 2>&1 || { tail -60 "$log"; exit 1; }
elapsed=$(awk "BEGIN { print $EPOCHREALTIME - $started }")

model_bytes=$(find .cache/fixtures/hf/Qwen/Qwen3-0.6B/*/ -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
snapshot=/var/lib/sparkfleet/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots
echo "weights of Qwen/Qwen3-0.6B (fixture, $model_bytes bytes) onto 3 simulated Sparks, origin fanout-1"
printf 'weights stage wall time: %.1f s (%s CPUs)\n' "$elapsed" "$(nproc)"
total=0
for host in fanout-1 fanout-2 fanout-3; do
  served=$(docker exec "$host" curl -fsS http://127.0.0.1:8480/_standin/stats | python3 -c 'import json, sys; print(json.load(sys.stdin)["bytes_served_total"])')
  digest=$(docker exec "$host" sh -c "cd $snapshot && find -L . -type f -exec sha256sum {} + | sort | sha256sum | cut -c1-16")
  printf '  %-9s Hub bytes served: %10s   snapshot digest: %s\n' "$host" "$served" "$digest"
  total=$((total + served))
done
awk -v t="$total" -v m="$model_bytes" 'BEGIN { r = t / m; printf "Hub bytes / model size: %.3f (goal <= 1.05: %s)\n", r, (r <= 1.05 ? "met" : "NOT met") }'
