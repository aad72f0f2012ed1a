r"""`jaxrl-llm-compile`: every program of a training step, compiled by XLA:TPU for a slice,
on any host (no TPU needed: `pip install "jax[tpu]"` brings the compiler).

  python -m launch.compile --config=qwen3_gsm8k:tpu_v5e_8,size=1.7b
  python -m launch.compile --config=configs/qwen3_gsm8k.py:tpu_v5p_32,size=1.7b \
      --topology=v5p:2x2x4 --config.train.micro_batch_size=64

`--topology` (e.g. v5e:2x4, v5p:4x4x4, v6e:8x8; `--num_slices=N` for multislice) defaults
to the slice the recipe names (`config.mesh.topology`, `config.mesh.num_slices`). The
config's mesh is laid over the slice's chips; `config.model.path` may be empty (the
recipe's `model.arch` gives the shapes) or a checkpoint directory (its config.json is read,
never its weights). Per program it prints XLA:TPU's memory per chip, what else is resident
beside it, the peak against the chip's HBM, FLOPs and HBM bytes per chip (every loop
counted its number of times), and a roofline time; then the step's roofline and the MFU
bound it implies. The last line is JSON (`analysis.StepReport.to_json`).

`--search` first compiles the update programs for every micro-batch and remat policy and
reports the step with the fastest combination that fits (`aot.search`).

Exit status: 0 when every program fits (with `--margin`: leaving that share of HBM free);
3 when one does not (named, with the shortfall and what to change); 2 for a bad flag, a
bad topology name, or a mesh that does not match the topology's chips (one line).
"""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: never claim a local TPU

from absl import flags  # noqa: E402

from jaxrl_llm import command_line  # noqa: E402

_CONFIG = command_line.config_flag(
    "A preset name (qwen3_gsm8k:tpu_v5e_8) or a config file (path[:arg]).")
_TOPOLOGY = flags.DEFINE_string("topology", "", "The TPU slice, GENERATION:SHAPE (v5e:2x4, "
                                "v5p:2x2x4, v6e:4x4); default: the config's mesh.topology.")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 0, "Slices joined over the data-center network "
                                   "(multislice); 0: the config's mesh.num_slices.")
_MARGIN = flags.DEFINE_float("margin", 0.0, "The share of HBM every program must leave free to "
                             "fit (0.1: 10%).")
_PROGRAMS = flags.DEFINE_list("programs", [], "Compile only these (sampler, turn, eval_sampler, "
                              "prepare, policy_update, value_update); default: all.")
_SEARCH = flags.DEFINE_bool("search", False, "First try every micro-batch and remat policy, then "
                            "report the step with the fastest that fits (aot/search.py).")
flags.mark_flags_as_required(["config"])
GIB = 2 ** 30
EXIT_DOES_NOT_FIT = 3


def main():
  # pylint: disable=g-import-not-at-top  (after flag parsing)
  from jaxrl_llm import config as config_lib
  from jaxrl_llm import training
  from jaxrl_llm.aot import analysis, chips, report, search
  config = _CONFIG.value
  topology = _TOPOLOGY.value or config.mesh.topology
  slices = _NUM_SLICES.value or config.mesh.num_slices
  if not topology:
    command_line.usage_error("--topology is not given and the config names no slice "
                             "(config.mesh.topology): expected e.g. --topology=v5e:2x4")
  try:
    devices = chips.topology_devices(topology, slices)
    config = report.for_compiling(config)
    config_lib.validate(config, devices)
    plan = training.make_plan(config)
    setup = training.set_up(config, plan, devices, abstract=True)
  except chips.TopologyError as e:  # a bad --topology, or a mesh it cannot hold: a usage error
    raise config_lib.ConfigError(" ".join(str(e).split())) from e
  name = topology + (f" x {slices} slices" if slices > 1 else "")
  if _SEARCH.value:
    candidates = search.search(config, devices, name, _MARGIN.value)
    chosen = search.best(candidates)
    print(search.table(candidates, chosen) + "\n")
    if chosen is not None:
      print(f"fastest that fits: --config.train.micro_batch_size={chosen.micro_batch_size} "
            f"--config.model.remat={chosen.remat}\n")
      with config.unlocked():
        config.train.micro_batch_size, config.model.remat = chosen.micro_batch_size, chosen.remat
      plan = training.make_plan(config)
      setup = training.set_up(config, plan, devices, abstract=True)
  result = analysis.analyse(config, plan, setup, name, _MARGIN.value, tuple(_PROGRAMS.value))
  print(report.text(result, config, chips.describe(devices)))
  print(json.dumps(result.to_json()))
  if not result.all_fit:
    print(report.shortfall(result, config), file=sys.stderr)
    sys.exit(EXIT_DOES_NOT_FIT)


def run():
  command_line.run(main, _CONFIG)


if __name__ == "__main__":
  run()
