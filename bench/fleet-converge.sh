#!/usr/bin/env bash
# Benchmark: how much longer provisioning three Sparks takes than provisioning one (issue 6's goal: <= 1.5; the
# fleet is provisioned in parallel, so only shared steps and this machine's CPUs should cost extra). Uses the
# fleet scenario's simulated Sparks, fresh each time: first site.yml on fleet-3 alone (its weights' origin left
# out by --limit, it fetches them itself), then on fleet-1, fleet-2 (a tensor-parallel pair) and fleet-3 together
# (fleet-1 fetching the weights, the others copying them).
# Prints both wall times and their ratio; asserts nothing.
#
#   bash bench/fleet-converge.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tests/run-all.sh setup >/dev/null
export PATH="$root/.venv/bin:$PATH" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1
log=$(mktemp)
trap 'molecule destroy -s fleet >/dev/null 2>&1; rm -f "$log"' EXIT

# fresh_fleet: new containers, prepared as the scenario prepares them (stand-ins and fixtures), nothing provisioned.
fresh_fleet() {
  molecule destroy -s fleet >/dev/null 2>&1
  molecule create -s fleet >/dev/null
  molecule prepare -s fleet >/dev/null
}

# converge LIMIT [EXTRA...]: site.yml (the scenario's converge) on LIMIT; prints the wall time in seconds.
converge() {
  local limit=$1 started
  shift
  started=$EPOCHREALTIME
  molecule converge -s fleet -- --limit "$limit" "$@" >"$log" 2>&1 || { tail -60 "$log" >&2; exit 1; }
  awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $started }"
}

fresh_fleet
one=$(converge fleet-3)
fresh_fleet
three=$(converge fleet-1,fleet-2,fleet-3)
echo "site.yml on fresh simulated Sparks ($(nproc) CPUs on this machine):"
echo "  1 Spark  (fleet-3):                          $one s"
echo "  3 Sparks (fleet-1 + fleet-2 as a pair, fleet-3): $three s"
awk -v a="$three" -v b="$one" 'BEGIN { r = a / b; printf "converge of 3 / converge of 1: %.2f (goal <= 1.5: %s)\n", r, (r <= 1.5 ? "met" : "NOT met") }'
