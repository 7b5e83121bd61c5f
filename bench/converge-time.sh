#!/usr/bin/env bash
# Benchmark: wall time of site.yml on a fresh simulated DGX Spark (first converge) and of a rerun with nothing
# to do (idempotent converge), with the changed count of each, and the ratio of the median rerun (and of the
# slowest) to the first converge (the target: at most 0.35). Prints the figures; asserts nothing.
# Uses the demo scenario's container (sparkfleet-demo): do not run it while `make demo` is in use.
#
#   bash bench/converge-time.sh [RUNS]      RUNS idempotent reruns to time (default 3)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
runs=${1:-3}
bash tests/run-all.sh setup >/dev/null
export PATH="$root/.venv/bin:$PATH" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1
log=$(mktemp)
trap 'molecule destroy -s demo >/dev/null 2>&1; rm -f "$log"' EXIT

molecule destroy -s demo >/dev/null 2>&1
molecule create -s demo >/dev/null
molecule prepare -s demo >/dev/null

# converge LABEL: run site.yml once, print its wall time and changed count.
converge() {
  local started elapsed changed
  started=$EPOCHREALTIME
  molecule converge -s demo >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
  elapsed=$(awk "BEGIN { print $EPOCHREALTIME - $started }")
  changed=$(grep -oE 'sparkfleet-demo +: ok=[0-9]+ +changed=[0-9]+' "$log" | grep -oE 'changed=[0-9]+')
  printf '%-24s %7.1f s   %s\n' "$1" "$elapsed" "$changed"
  last_elapsed=$elapsed
}

echo "site.yml on a simulated DGX Spark ($(nproc) CPUs, $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
converge "first converge"
first=$last_elapsed
reruns=()
for run in $(seq "$runs"); do
  converge "idempotent rerun $run"
  reruns+=("$last_elapsed")
done
printf '%s\n' "${reruns[@]}" | sort -n | awk -v first="$first" '
  { t[NR] = $1 }
  END {
    median = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "%-24s %7.2f   (median rerun / first converge; target <= 0.35)\n", "ratio", median / first
    printf "%-24s %7.2f   (slowest rerun / first converge)\n", "ratio, slowest", t[NR] / first
  }'

