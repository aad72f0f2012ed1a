r"""`jaxrl-llm-evaluate`: a saved policy's greedy pass@1, pass@k, maj@K and mean reward on
every source of a config, parsing flags and then making one library call
(`training.checkpoint_eval.evaluate`).

  python -m launch.evaluate --config=configs/grpo_arithmetic.py \
      --model=jaxrl_llm/assets/arithmetic_sft --samples=8 --output=/tmp/eval_sft
  python -m launch.evaluate --config=configs/grpo_arithmetic.py --model=/tmp/grpo_arith:100

`--model` is a Hugging Face directory (config.json and weights; `--output` required) or a
training workdir, `WORKDIR[:STEP]` (its latest checkpoint by default; output in
WORKDIR/eval_STEP). `--config` is a preset name or a config file, with `--config.x.y=v`
overrides as for `jaxrl-llm-train` (`config.eval` sets what counts as correct, the k's and
the answer extractor); `--samples` K defaults to config.eval.num_samples, else
config.sampling.num_samples. Several processes: the same flags as `jaxrl-llm-train`.

Exit status: 0 when the evaluation finished; 2 for a bad flag, config value, model
directory, checkpoint step, split or output directory (one line on stderr, before the
model loads); 1 on any other error (one line; the traceback with --verbose).
"""
import traceback

from absl import flags

from jaxrl_llm import command_line

_CONFIG = command_line.config_flag()
_MODEL = flags.DEFINE_string("model", None, "A Hugging Face directory, or a training workdir "
                             "WORKDIR[:STEP] (default: its latest checkpoint).")
_SAMPLES = flags.DEFINE_integer("samples", None, "K samples per record (default: "
                                "config.eval.num_samples, else config.sampling.num_samples).")
_SPLIT = flags.DEFINE_string("split", "eval", "The split of every source.")
_OUTPUT = flags.DEFINE_string("output", None, "Where eval.jsonl and summary.json go (default: "
                              "WORKDIR/eval_STEP; required for a Hugging Face directory).")
_JOIN = command_line.process_flags()  # --coordinator_address, --num_processes, ...
_VERBOSE = flags.DEFINE_bool("verbose", False, "On an error, also print its traceback.")
flags.mark_flags_as_required(["config", "model"])


def main():
  from jaxrl_llm.training import checkpoint_eval  # pylint: disable=g-import-not-at-top
  checkpoint_eval.evaluate(_CONFIG.value, _MODEL.value, _SAMPLES.value, _SPLIT.value,
                           _OUTPUT.value)


def _failed(error: Exception) -> str:
  """The evaluation's own failure: one line (and its traceback with --verbose)."""
  if _VERBOSE.value:
    traceback.print_exc()
  return (f"the evaluation failed: {type(error).__name__}: {' '.join(str(error).split())} "
          "(--verbose prints the traceback)")


def run():
  command_line.run(main, _CONFIG, join=_JOIN, failed=_failed)


if __name__ == "__main__":
  run()
