#!/usr/bin/env bash
# `make test`: everything a fresh Debian 12 machine needs, then every test.
#
#   setup:  apt packages, the Docker engine (dockerd started by hand: these machines have no systemd),
#           the simulated-Spark images beside the Python venv and the fixtures that need no image (signed apt
#           repo, Hub models, the prefetch venv's wheels, the real vLLM engine for the CPU, the real models it
#           serves), then the fixtures built on the images (the stand-in's registry, a registry holding the engine)
#   checks: yamllint, ansible-lint, ruff, pytest, every molecule scenario (the linters and the scenarios beside
#           pytest)
#
# Each check counts as passed or failed (pytest counts each of its tests). The last line is
# "sparkfleet: N passed, N failed"; the exit status is non-zero when anything failed.
# `tests/run-all.sh lint` runs the linters alone; `tests/run-all.sh setup` only prepares the machine (what
# `make demo` and bench/ need); `tests/run-all.sh open-webui` (opt-in) sets up, then logs into the real Open WebUI
# and chats through the fleet's gate.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=$root/.venv
cache=$root/.cache
results=$root/tests/.results
export PATH="$venv/bin:$PATH"
export ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1

passed=0
failed=0
timings=()
run_started=$(date +%s)

# step NAME COMMAND...: run one step, time it, count it as one check.
step() {
  local name=$1 started rc
  shift
  echo
  echo "=== $name"
  started=$(date +%s)
  "$@"
  rc=$?
  timings+=("$(printf '%-28s %5ss  %s' "$name" $(($(date +%s) - started)) "$([ $rc -eq 0 ] && echo ok || echo FAILED)")")
  if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  return $rc
}

finish() {
  echo
  echo "=== time by step"
  printf '%s\n' "${timings[@]}"
  printf '%-28s %5ss  %s\n' "total (wall clock)" $(($(date +%s) - run_started)) "steps marked beside overlap the others"
  echo "sparkfleet: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}

# --- setup: a failure here stops the run, since no check could mean anything without it ---------------------

# python3-venv: the engine fixture's venv is made with Debian's own Python (tests/fixtures/build-vllm-engine.sh).
# python3-packaging: the vllm_bench role's integration test builds its llama-benchy venv on this machine, and
# ansible.builtin.pip wants it, as on a Spark (the role installs it there).
apt_packages=(docker.io debootstrap docker-registry apt-utils gnupg curl make iproute2 iputils-ping openssh-client
  python3-venv python3-packaging prometheus prometheus-node-exporter haproxy)
install_apt_packages() {
  local missing=()
  for package in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "all present: ${apt_packages[*]}"; return 0; }
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

start_docker_engine() {
  if docker info >/dev/null 2>&1; then
    echo "dockerd already answers"
    return 0
  fi
  mkdir -p "$cache"
  nohup dockerd >"$cache/dockerd.log" 2>&1 &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && { echo "dockerd started (log: $cache/dockerd.log)"; return 0; }
    sleep 1
  done
  tail -20 "$cache/dockerd.log"
  return 1
}

make_venv() {
  local stamp="$venv/.dev-requirements" want
  want=$(cat requirements.txt requirements-dev.txt | sha256sum)
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && { echo "venv is current"; return 0; }
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || return 1
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r requirements-dev.txt || return 1
  echo "$want" >"$stamp"
}

# The fixtures that need no image: the real engine and its models come before the Hub fixture (which serves
# SmolLM2 from the real models).
build_fixtures_without_images() {
  bash tests/fixtures/build-apt-repo.sh "$cache/fixtures/apt" &&
    bash tests/fixtures/build-wheelhouse.sh "$cache/fixtures/wheels" &&
    bash tests/fixtures/build-vllm-engine.sh "$cache/fixtures/vllm-engine" &&
    "$cache/fixtures/vllm-engine/bin/python" tests/fixtures/build_real_models.py "$cache/fixtures/real-models" &&
    python tests/fixtures/build_hf_models.py "$cache/fixtures/hf" --real-models "$cache/fixtures/real-models"
}

# The registries hold images built on the python-base image (tests/simspark/build-images.sh): the stand-in's, and
# the engine's from its venv.
build_fixtures_on_images() {
  bash tests/fixtures/build-registry.sh "$cache/fixtures/registry" &&
    bash tests/fixtures/build-engine-registry.sh "$cache/fixtures/registry-engine" "$cache/fixtures/vllm-engine"
}

# The simulated-Spark images (debootstrap, then docker build) are built beside the venv and the fixtures that need
# no image, which spend most of their time downloading (pip, the engine's 765 MB): on a fresh machine this hides
# the images' minutes. Their output goes to tests/.results/images.log, printed when they end.
start_images_beside() {
  mkdir -p "$results"
  echo
  echo "=== simulated-Spark images: started beside the venv and the fixtures (log: tests/.results/images.log)"
  (
    started=$(date +%s)
    bash tests/simspark/build-images.sh >"$results/images.log" 2>&1
    echo "$? $(($(date +%s) - started))" >"$results/images.status"
  ) &
  images_pid=$!
}

finish_images_beside() {
  local rc elapsed
  wait "$images_pid"
  read -r rc elapsed <"$results/images.status"
  echo
  echo "=== simulated-Spark images (ran beside the venv and the fixtures)"
  cat "$results/images.log"
  timings+=("$(printf '%-28s %5ss  %s' "Spark images (beside)" "$elapsed" "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")")
  if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  return "$rc"
}

setup() {
  step "apt packages" install_apt_packages &&
    step "docker engine" start_docker_engine || return 1
  rm -f "$results/images.status"
  start_images_beside
  step "python venv" make_venv &&
    step "fixtures without images" build_fixtures_without_images
  local rc=$?
  finish_images_beside || return 1
  [ "$rc" -eq 0 ] && step "fixtures on images" build_fixtures_on_images
}

# --- checks ----------------------------------------------------------------------------------------------------

lint() {
  step "yamllint" yamllint --strict .
  step "ansible-lint" ansible-lint
  step "ruff check" ruff check .
  step "ruff format" ruff format --check .
}

run_pytest() {
  local started
  started=$(date +%s)
  echo
  echo "=== pytest"
  mkdir -p "$results"
  rm -f "$results/pytest.xml"
  nice -n "$(niceness pytest)" pytest tests -p no:cacheprovider --junitxml="$results/pytest.xml"
  local rc=$?
  # Count pytest's tests one by one instead of as one check.
  read -r tests failures < <(python3 - "$results/pytest.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
print(int(suite.get("tests", 0)) - int(suite.get("skipped", 0)), bad)
EOF
  )
  passed=$((passed + ${tests:-0} - ${failures:-0}))
  failed=$((failed + ${failures:-0}))
  # pytest failed without a failing test (a collection error, or no report at all): count that too.
  if [ "$rc" -ne 0 ] && [ "${failures:-0}" -eq 0 ]; then failed=$((failed + 1)); fi
  timings+=("$(printf '%-28s %5ss  %s' pytest $(($(date +%s) - started)) "$((${tests:-0} - ${failures:-0})) passed, ${failures:-?} failed")")
}

# The scenarios that are tests. Not tests: demo leaves its simulated Spark running for you (make demo); fanout is
# a benchmark's (bench/fleet-fanout.sh).
test_scenarios() {
  local scenario
  for scenario in molecule/*/molecule.yml; do
    scenario=$(basename "$(dirname "$scenario")")
    case "$scenario" in demo | fanout) ;; *) echo "$scenario" ;; esac
  done
}

# The scenarios run beside pytest instead of after it: the fleet's is the longest step by far and spends most of it
# waiting (on its hosts' services, health gates, rolling restarts), and the default scenario's real engine waits on
# its start and its answers too. Their hosts, networks and loopback ports are their own, and every test waits on
# readiness with deadlines sized for a busy machine. Each one's output goes to tests/.results/molecule-NAME.log and
# is printed when it ends.
declare -A beside_pids=()

# The fleet's scenario is the critical path (it ends last, with the machine's cores mostly idle by then), while
# pytest and the other scenarios end long before it: their processes on this machine run at a lower priority, so
# that where the checks contend for the two cores, the fleet's playbooks get them first. Processes inside the test
# hosts' containers run at Docker's own priority.
niceness() {
  [ "$1" = fleet ] && echo 0 || echo 10
}
start_beside() {
  local scenario=$1
  mkdir -p "$results"
  rm -f "$results/molecule-$scenario.status"
  echo
  echo "=== molecule $scenario: started beside the other checks (log: tests/.results/molecule-$scenario.log)"
  (
    started=$(date +%s)
    nice -n "$(niceness "$scenario")" molecule test -s "$scenario" >"$results/molecule-$scenario.log" 2>&1
    echo "$? $(($(date +%s) - started))" >"$results/molecule-$scenario.status"
  ) &
  beside_pids[$scenario]=$!
}

finish_beside() {
  local scenario=$1 rc elapsed
  wait "${beside_pids[$scenario]}"
  read -r rc elapsed <"$results/molecule-$scenario.status" || { rc=1 elapsed=0; }
  echo
  echo "=== molecule $scenario (ran beside the other checks)"
  cat "$results/molecule-$scenario.log"
  timings+=("$(printf '%-28s %5ss  %s' "molecule $scenario (beside)" "$elapsed" "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)")")
  if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

# The linters (about 45 s, ansible-lint's nearly all) run beside the other checks too, so that neither pytest nor
# the fleet's scenario waits for them: their output goes to tests/.results/lint.log, printed when they end, and each
# counts as one check, as when they run alone.
start_lint_beside() {
  mkdir -p "$results"
  rm -f "$results/lint.counts" "$results/lint.timings"
  echo
  echo "=== linters: started beside the other checks (log: tests/.results/lint.log)"
  (
    local before_passed=$passed before_failed=$failed
    renice -n "$(niceness lint)" -p "$BASHPID" >/dev/null
    timings=()
    lint >"$results/lint.log" 2>&1
    echo "$((passed - before_passed)) $((failed - before_failed))" >"$results/lint.counts"
    printf '%s\n' "${timings[@]}" >"$results/lint.timings"
  ) &
  lint_pid=$!
}

finish_lint_beside() {
  local lint_passed lint_failed line
  wait "$lint_pid"
  echo
  echo "=== linters (ran beside the other checks)"
  cat "$results/lint.log"
  read -r lint_passed lint_failed <"$results/lint.counts" || { lint_passed=0 lint_failed=1; }
  passed=$((passed + lint_passed))
  failed=$((failed + lint_failed))
  while IFS= read -r line; do
    [ -n "$line" ] && timings+=("$line (beside)")
  done <"$results/lint.timings"
}

checks() {
  local scenario
  for scenario in $(test_scenarios); do
    start_beside "$scenario"
  done
  start_lint_beside
  run_pytest
  finish_lint_beside
  for scenario in $(test_scenarios); do
    finish_beside "$scenario"
  done
}

# Opt-in, not part of `make test`: the real Open WebUI (open-webui 0.12.4, about 7.4 GB with torch and its CUDA
# libraries) in a venv of its own under .cache, logged into and chatting through the fleet's gate.
open_webui() {
  local webui_venv=$cache/open-webui
  if [ ! -x "$webui_venv/bin/open-webui" ]; then
    python3 -m venv "$webui_venv" && "$webui_venv/bin/pip" install --quiet open-webui==0.12.4 || return 1
  fi
  SPARKFLEET_OPEN_WEBUI_VENV=$webui_venv pytest -q -p no:cacheprovider tests/integration/test_open_webui.py
}

if [ "${1:-all}" = lint ]; then
  lint
  finish
fi

setup || finish
[ "${1:-all}" = setup ] && finish
if [ "${1:-all}" = open-webui ]; then
  step "open-webui (opt-in)" open_webui
  finish
fi
checks
finish
