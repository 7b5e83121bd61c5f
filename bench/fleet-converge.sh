#!/usr/bin/env bash
# Benchmark: how much longer provisioning three Sparks takes than provisioning one (issue 6's goal: <= 1.5; the
# fleet is provisioned in parallel, so only shared steps and this machine's CPUs should cost extra). Uses the
# fleet scenario's simulated Sparks, fresh each time: first site.yml on fleet-3 alone (its weights' origin left
# out by --limit, it fetches them itself), then on fleet-1, fleet-2 (a tensor-parallel pair) and fleet-3 together
# (fleet-1 fetching the weights, the others copying them).
# Prints both wall times, their ratio, and the CPU time the whole machine spent in each run: on a small machine
# three simulated Sparks (each with its own dockerd, apt, pip and sha256) share the same few cores, so the ratio
# there measures those cores as much as the playbooks. SPARK_CPUS caps each simulated Spark at that many CPUs
# (`docker update --cpus`) in both runs, the way each real Spark brings its own 20 cores: with 3 x SPARK_CPUS
# below this machine's cores, the three no longer compete with each other. Asserts nothing.
#
#   bash bench/fleet-converge.sh                  # as fast as this machine goes
#   SPARK_CPUS=0.5 bash bench/fleet-converge.sh   # each simulated Spark held to half a core, alone or not
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tests/run-all.sh setup >/dev/null
export PATH="$root/.venv/bin:$PATH" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1
log=$(mktemp)
trap 'molecule destroy -s fleet >/dev/null 2>&1; rm -f "$log"' EXIT

spark_cpus=${SPARK_CPUS:-}

# fresh_fleet: new containers, prepared as the scenario prepares them (stand-ins and fixtures), nothing provisioned.
fresh_fleet() {
  molecule destroy -s fleet >/dev/null 2>&1
  molecule create -s fleet >/dev/null
  molecule prepare -s fleet >/dev/null
  [ -z "$spark_cpus" ] || docker update --cpus "$spark_cpus" fleet-1 fleet-2 fleet-3 >/dev/null
}

# busy_cpu_seconds: CPU time spent so far by the whole machine (user, nice, system, irq, softirq, steal).
busy_cpu_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '/^cpu / { print ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat
}

# converge LIMIT [EXTRA...]: site.yml (the scenario's converge) on LIMIT; prints "WALL_S CPU_S".
converge() {
  local limit=$1 started cpu_before
  shift
  cpu_before=$(busy_cpu_seconds)
  started=$EPOCHREALTIME
  molecule converge -s fleet -- --limit "$limit" "$@" >"$log" 2>&1 || { tail -60 "$log" >&2; exit 1; }
  awk -v wall="$(awk "BEGIN { print $EPOCHREALTIME - $started }")" -v cpu="$(busy_cpu_seconds)" -v before="$cpu_before" \
    'BEGIN { printf "%.1f %.0f", wall, cpu - before }'
}

# report LABEL "WALL_S CPU_S": one line with the wall time, the CPU time and how busy the machine's cores were.
report() {
  local cores
  cores=$(nproc)
  echo "$2" | awk -v label="$1" -v cores="$cores" \
    '{ printf "  %-50s %6.1f s wall, %5.0f CPU-s (cores %.0f%% busy)\n", label, $1, $2, 100 * $2 / ($1 * cores) }'
}

fresh_fleet
one=$(converge fleet-3)
fresh_fleet
three=$(converge fleet-1,fleet-2,fleet-3)
echo "site.yml on fresh simulated Sparks ($(nproc) CPUs on this machine, each Spark capped at: ${spark_cpus:-no cap}):"
report "1 Spark  (fleet-3)" "$one"
report "3 Sparks (fleet-1 + fleet-2 as a pair, fleet-3)" "$three"
awk -v a="${three% *}" -v b="${one% *}" \
  'BEGIN { r = a / b; printf "converge of 3 / converge of 1: %.2f (goal <= 1.5: %s)\n", r, (r <= 1.5 ? "met" : "NOT met") }'
