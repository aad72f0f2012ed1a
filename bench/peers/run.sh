#!/usr/bin/env bash
# Runs the tiny-grpo-cpu peer benchmarks strictly one at a time and prints the table.
#
# From the checkout, after `make install` and `bash bench/peers/setup.sh`:
#   bash bench/peers/run.sh
#   REPS="1 2 3" BENCHES="trl_grpo jaxrl_grpo" bash bench/peers/run.sh
#
# REPS     rounds, each running every benchmark once in order (default "1 2")
# BENCHES  which ones (default: matmul_jax trl_grpo tunix_grpo jaxrl_grpo jaxrl_grpo_2dev)
#          matmul_jax       float32 matmul rate through jax (checkout's .venv): the ceiling
#          trl_grpo         TRL 1.16 on PyTorch ($PEERS/trl)
#          trl_grpo_gc      the same with TRL's default gradient checkpointing
#          tunix_grpo       tunix 0.1.7 on JAX ($PEERS/tunix)
#          jaxrl_grpo       jaxrl_llm from this checkout, one XLA CPU device
#          jaxrl_grpo_2dev  the same with one XLA CPU device per core (2)
# PEERS    where setup.sh built the peers' environments (default ~/.cache/jaxrl_peers)
# KEEP_RESULTS=1  add to bench/peers/results/ instead of starting a new sitting
#          (by default earlier JSON files move to results/old/<time>/ first, so the
#          table only holds this sitting's runs)
#
# Results: bench/peers/results/<bench>_r<round>.json; each run's output in
# bench/peers/logs/<bench>_r<round>.log. Run nothing else on the machine meanwhile:
# every result records how many cores other processes used, and the table flags runs
# that were measured under load.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"
PEERS=${PEERS:-$HOME/.cache/jaxrl_peers}
REPS=${REPS:-1 2}
BENCHES=${BENCHES:-matmul_jax trl_grpo tunix_grpo jaxrl_grpo jaxrl_grpo_2dev}
RESULTS=$HERE/results LOGS=$HERE/logs
JAXRL_PY=$ROOT/.venv/bin/python

# Nothing may reach the network: the model, tokenizer and data are built locally.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_DISABLED=true
export JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=   # a CPU benchmark, even on a GPU host

python_for() {  # the interpreter a benchmark runs with
  case $1 in
    trl_grpo*) echo "$PEERS/trl/bin/python" ;;
    tunix_grpo) echo "$PEERS/tunix/bin/python" ;;
    matmul_jax|jaxrl_grpo|jaxrl_grpo_2dev) echo "$JAXRL_PY" ;;
    *) echo "" ;;
  esac
}

for b in $BENCHES; do
  py=$(python_for "$b")
  if [ -z "$py" ]; then
    echo "unknown benchmark $b" >&2; exit 2
  elif [ ! -x "$py" ]; then
    case $py in
      "$JAXRL_PY") echo "no $py: run \`make install\` in $ROOT first" >&2 ;;
      *) echo "no $py: run \`bash bench/peers/setup.sh\` first (PEERS=$PEERS)" >&2 ;;
    esac
    exit 2
  fi
done

mkdir -p "$RESULTS" "$LOGS"
if [ "${KEEP_RESULTS:-0}" != 1 ] && compgen -G "$RESULTS/*.json" > /dev/null; then
  old=$RESULTS/old/$(date -u +%Y%m%dT%H%M%SZ)
  mkdir -p "$old" && mv "$RESULTS"/*.json "$old"/
  echo "earlier results moved to $old"
fi

failed=0
for rep in $REPS; do
  for b in $BENCHES; do
    py=$(python_for "$b") flags=${XLA_FLAGS:-} args=(--round "$rep" --results "$RESULTS")
    case $b in
      trl_grpo_gc) script=trl_grpo.py args+=(--gradient-checkpointing) ;;
      jaxrl_grpo_2dev) script=jaxrl_grpo.py args+=(--bench "$b")
                       flags="$flags --xla_force_host_platform_device_count=2" ;;
      *) script=$b.py ;;
    esac
    log=$LOGS/${b}_r$rep.log
    printf '%s  %-16s round %s ... ' "$(date -u +%H:%M:%S)" "$b" "$rep"
    start=$SECONDS
    if XLA_FLAGS=$flags "$py" "$HERE/$script" "${args[@]}" > "$log" 2>&1; then
      echo "done in $((SECONDS - start)) s"
    else
      echo "FAILED after $((SECONDS - start)) s: see $log"; failed=1
    fi
  done
done
echo
python3 "$HERE/table.py" --results "$RESULTS"
exit $failed
