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
import sys
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

from jaxrl_llm import command_line

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A preset name (grpo, ppo:runlocal) or a config file (path[:arg]).",
    lock_config=True)
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # pylint: disable=g-import-not-at-top  (after flag parsing)
  from jaxrl_llm import config as config_lib
  from jaxrl_llm.training import checkpoint_eval
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
  _JOIN()
  try:
    checkpoint_eval.evaluate(_CONFIG.value, _MODEL.value, _SAMPLES.value, _SPLIT.value,
                             _OUTPUT.value)
  except config_lib.ConfigError as e:  # raised before the model loads: a usage error
    command_line.usage_error("; ".join(str(e).splitlines()), flags_help=False)
  except Exception as e:  # noqa: BLE001 -- the evaluation's own failure
    if _VERBOSE.value:
      traceback.print_exc()
    print(f"the evaluation failed: {type(e).__name__}: {' '.join(str(e).split())} "
          "(--verbose prints the traceback)", file=sys.stderr)
    sys.exit(1)


def run():
  command_line.run(main, _CONFIG)


if __name__ == "__main__":
  run()
