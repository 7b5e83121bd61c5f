#!/usr/bin/env bash
# Regenerate the vLLM contract files from a release: a scratch venv outside the repository (about 6 GB), the
# release from PyPI, then regenerate.py inside it. Usage: regenerate.sh VERSION [VENV]   (e.g. 0.33.0)
set -euo pipefail
version=${1:?usage: regenerate.sh VERSION [VENV]}
venv=${2:-${TMPDIR:-/tmp}/sparkfleet-vllm-$version}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$version')" 2>/dev/null ||
  VLLM_TARGET_DEVICE=cpu "$venv/bin/pip" install --disable-pip-version-check "vllm==$version"
"$venv/bin/python" "$here/regenerate.py" "$version"
