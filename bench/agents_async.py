"""Episodes that never wait for one another: episodes/s of multi-turn episodes played with
episode-level admission (`rollouts.admitted.AdmittedEpisodePlayer`, config.sampling.engine
'continuous' or 'auto') against the turn-synchronous player (`episodes.EpisodePlayer`,
'static': a batch's next turn starts when every episode's environment has answered), in
one process, same model, same records, same tokens.

Environment: `LatencyEnv` below, loaded by path as a user's is. A record's episode lasts
3 + i % 3 model turns (3 to 5): after each turn the environment sleeps, then answers with
a short tool message; its sleep is lognormal with median 0.2 s and p99 3 s (sigma =
ln(15) / 2.326), drawn from a generator seeded by the record and the turn, so both players
meet the same latencies. `--latency=0` plays the same episodes with answers at once (what
admission costs when nothing is slow).

Model: the shipped `jaxrl_llm/assets/calculator_sft` (Llama, 4 layers, hidden 64; its chat
template) on one XLA CPU device, greedy (temperature 0), so both players sample the same
tokens (checked: every episode's tokens agree), at most 96 new tokens a turn and 600 tokens
an episode. `--episodes` (64) distinct problems of the calculator task per play, all in
flight at once (env_workers = episodes). A warm-up play of other problems (with latency 0)
compiles both players' programs; then `--rounds` rounds, the players back to back.
Printed: median s per play, episodes/s, model turns per episode, and admission over
turn-synchronous (median of per-round ratios; the issue's target is >= 2x).

  .venv/bin/python bench/agents_async.py                 # 3 rounds (about 2 minutes)
  .venv/bin/python bench/agents_async.py --latency=0     # the environment answers at once

The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from jaxrl_llm import envs  # pylint: disable=wrong-import-position
from jaxrl_llm.envs import calculator, tools  # pylint: disable=wrong-import-position

SIGMA = 1.1642  # lognormal: p99 / median = exp(2.326 sigma) = 15


class LatencyEnv(envs.Environment):
  """The calculator task's opening and tool, 3 to 5 model turns per record, each answer
  after a lognormal sleep (module docstring). The tool runs in this process (the built-in
  `ToolEnv` runs it in a worker process per environment); an answer before the record's
  last turn is met by the question again, as a user message."""

  def __init__(self, median_s: float = 0.2):
    super().__init__()
    self.median_s = median_s

  def tool_schemas(self) -> list[dict]:
    from transformers.utils import chat_template_utils  # pylint: disable=g-import-not-at-top
    return [chat_template_utils.get_json_schema(calculator.calc)]

  def reset(self, record):
    return [{"role": "user", "content": record["prompt"]}]

  def step(self, messages):
    question = messages[0]["content"]
    k = sum(m["role"] == "assistant" for m in messages)
    turns = 3 + sum(map(ord, question)) % 3  # 3 to 5, the same for every play of a record
    if self.median_s:
      rng = random.Random(f"{question}|{k}")
      time.sleep(rng.lognormvariate(0.0, SIGMA) * self.median_s)
    if k >= turns:
      return [], 1.0, True
    calls = tools.parse_tool_calls(messages[-1]["content"])
    if not calls:  # answered early: ask again
      return [{"role": "user", "content": question}], 0.0, False
    return [{"role": "tool", "content": _calc(c)} for c in calls], 0.0, False


def _calc(call) -> str:
  if not isinstance(call, tools.ToolCall):
    return call.message
  try:
    return calculator.calc(**call.arguments) if call.name == "calc" else "error: unknown tool"
  except Exception as e:  # pylint: disable=broad-except
    return f"error: {e}"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--episodes", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--latency", type=float, default=0.2, help="median seconds (0: none)")
  args = parser.parse_args()

  import dataclasses
  import jax
  from jaxrl_llm import assets, data, models, sampling, tasks
  from jaxrl_llm import config as config_lib
  from jaxrl_llm.config import sources as sources_lib
  from jaxrl_llm.training.rollouts import episodes
  from jaxrl_llm.training.rollouts.players import player_for

  path = assets.path("calculator_sft")
  policy = models.from_pretrained(path)
  tokenizer = data.load_tokenizer(path)
  model = episodes.local_model(policy)
  players = {}
  for name, engine in (("turn-synchronous", "static"), ("admission", "continuous")):
    config = config_lib.presets.load(os.path.join(REPO, "configs/grpo_calculator.py"))
    config.unlock()
    config.data.env = f"{os.path.abspath(__file__)}:LatencyEnv"
    config.data.env_args = {"median_s": args.latency}
    config.data.env_workers = args.episodes
    config.data.max_turns = 5
    config.data.max_episode_tokens = 600
    config.sampling.max_new_tokens = 96
    config.sampling.temperature = 0.0
    config.sampling.engine = engine
    settings = sampling.settings.from_config(config.sampling,
                                             sampling.eos_ids(tokenizer, policy.config),
                                             sampling.pad_id(tokenizer))
    players[name] = player_for(sources_lib.run_sources(config)[0], tokenizer, settings)
  records = tasks.load_split("calculator", "train")
  E = args.episodes

  def batch(r):
    return [dict(records[i]) for i in range(r * E, (r + 1) * E)], list(range(r * E, (r + 1) * E))

  results = {name: [] for name in players}
  try:
    for name, player in players.items():  # warm-up: the same shapes, answers at once
      for env in player.envs:
        env.median_s = 0.0
      t = time.perf_counter()
      player.play(model, *batch(100), jax.random.PRNGKey(100))
      print(f"  warm-up {name}: {time.perf_counter() - t:.1f} s", flush=True)
      for env in player.envs:
        env.median_s = args.latency
    for r in range(args.rounds):
      tokens = {}
      for name, player in players.items():
        t = time.perf_counter()
        played = player.play(model, *batch(r), jax.random.PRNGKey(r))
        wall = time.perf_counter() - t
        tokens[name] = [ep.tokens for ep in played]
        results[name].append(dict(wall=wall, turns=statistics.mean(ep.num_turns for ep in played)))
        print(f"  round {r} {name}: {wall:.2f} s", flush=True)
      same = sum(a == b for a, b in zip(*tokens.values()))
      print(f"  round {r}: {same} of {E} episodes' tokens agree", flush=True)
  finally:
    for player in players.values():
      player.close()
  rows = {}
  for name, runs in results.items():
    wall = statistics.median(x["wall"] for x in runs)
    rows[name] = dict(wall_s=round(wall, 3), episodes_per_s=round(E / wall, 2),
                      turns=round(statistics.mean(x["turns"] for x in runs), 2))
  ratios = [a["wall"] / b["wall"] for a, b in zip(results["turn-synchronous"],
                                                    results["admission"])]
  print(f"\n| player ({E} episodes a play, latency median {args.latency} s) | s/play | "
        "episodes/s | model turns |")
  print("|---|---|---|---|")
  for name, row in rows.items():
    print(f"| {name} | {row['wall_s']:.2f} | {row['episodes_per_s']:.1f} | {row['turns']:.2f} |")
  print(f"admission / turn-synchronous: {statistics.median(ratios):.2f}x "
        f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})")
  print(json.dumps(dict(rows=rows, ratio=statistics.median(ratios), ratios=ratios,
                        latency=args.latency, episodes=E)))


if __name__ == "__main__":
  main()
