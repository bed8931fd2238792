#!/usr/bin/env bash
# The tests against the real vLLM 0.33.0 (tests/real_vllm/), on the CPU, in a
# virtual environment of their own, kept between runs outside the clone:
# ~/.cache/gen-mixin/vllm-venv (or $GEN_MIXIN_VLLM_VENV). It is built again
# only when tests/real_vllm/requirements.txt changes (a cold build takes a few
# minutes and about 7 GB; see README.md); a warm run pays the editable
# install of this checkout and the tests. Extra arguments go to pytest.
#
# Exit status: pytest's, or 3 when the environment could not be built (no
# network, say), so that a caller can tell "did not run" from "failed".
set -euo pipefail
cd "$(dirname "$0")/../.."

cache="${HOME}/.cache/gen-mixin"
venv="${GEN_MIXIN_VLLM_VENV:-$cache/vllm-venv}"
requirements=tests/real_vllm/requirements.txt
stamp="$venv/.gen-mixin-requirements"
want="$(sha256sum "$requirements" | cut -d' ' -f1) vllm==0.33.0"

build_venv() {
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q -r "$requirements"
    local wheel
    wheel=$(find "$cache" -maxdepth 1 -name 'vllm-0.33.0-*.whl' | head -n 1)
    "$venv/bin/python" -m pip install -q --no-deps "${wheel:-vllm==0.33.0}"
    echo "$want" >"$stamp"
}

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "=== real vLLM: building $venv (cold: a few minutes)"
    started=$SECONDS
    if ! build_venv; then
        echo "=== real vLLM: could not build $venv; its tests did not run"
        exit 3
    fi
    echo "=== real vLLM: built in $((SECONDS - started)) s"
fi
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
export VLLM_TARGET_DEVICE=cpu
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/real_vllm "$@"
