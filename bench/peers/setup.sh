#!/usr/bin/env bash
# Builds the two peer stacks the side-by-side benchmark compares jaxrl_llm with, one
# virtual environment each under $PEERS (default ~/.cache/jaxrl_peers):
#   $PEERS/trl    Hugging Face TRL 1.16 on PyTorch (CPU)
#   $PEERS/tunix  Google's tunix 0.1.7 on JAX (CPU)
# jaxrl_llm itself runs from the checkout's .venv (`make install`), not from here.
#
# Idempotent: an environment whose marker file exists is left alone; a half-built one
# (an interrupted install) is completed on the next call. PYTHON picks the interpreter.
set -euo pipefail
PEERS=${PEERS:-$HOME/.cache/jaxrl_peers}
PYTHON=${PYTHON:-python3}
mkdir -p "$PEERS"

# make_env NAME PIP-ARGS... [-- PIP-ARGS...]: one `pip install` per group, in order.
make_env() {
  local name=$1; shift
  local env=$PEERS/$name
  if [ -f "$env/.bench_ready" ]; then
    echo "$name: ready ($env)"
    return
  fi
  echo "$name: building $env"
  [ -x "$env/bin/python" ] || "$PYTHON" -m venv "$env"
  local group=()
  for arg in "$@" --; do
    if [ "$arg" = -- ]; then
      [ ${#group[@]} -eq 0 ] || "$env/bin/python" -m pip install -q "${group[@]}"
      group=()
    else
      group+=("$arg")
    fi
  done
  touch "$env/.bench_ready"
}

# torch first and pinned: the 2.13.0 CPU wheel is what this machine provides; left
# unpinned, TRL's requirement would pull a multi-GB CUDA build.
make_env trl torch==2.13.0 -- trl==1.16.0 transformers tokenizers
# tunix brings jax, flax, optax, grain and transformers with it.
make_env tunix google-tunix==0.1.7

echo "peer environments ready in $PEERS"
