"""Every decode path's completions, recorded: what a refactor of generation must reproduce,
token for token (issue 51).

The four engines `sampling.engine_kind` names, on engine_test's tiny float32 Qwen2 (2
layers) on one CPU device, for 2 seeds and both layer loops ('scan', 'unrolled'):

- 'static' and 'continuous' (`sampling.Sampler`): 3 prompts x G 2 samples, 16 new tokens at
  most, temperature 1, top-p 0.9, stop ids (3, 4, 5); the continuous engine in 2 slots, so
  the 6 requests are admitted in waves;
- 'slots' (`serving.Engine`, 2 slots): the same 6 requests, request r = p*G + g with the
  static call's key of row r (`sampling.request_keys`);
- 'turns' (`sampling.TurnSampler`): turns_test's `play`, 3 episodes of 3 turns over a kept
  cache, scripted replies between turns;

and the episodes of both episode players (`episodes.EpisodePlayer`, the turns in lockstep;
`admitted.AdmittedEpisodePlayer`, each episode admitted on the slot engine) on
admission_test's scripted environment (its fast records: no delays), 4 episodes for each of
2 seeds, on agent_testing's model and character tokenizer.

Recorded: tokens, lengths (finish reasons, turn lengths, endings) exactly; behaviour
log-probs at atol 1e-5 (stored rounded to 6 decimals). Besides the record, the agreements
today's tests state (continuous_test.SameAsStaticTest, engine_test's "static engine's
completion"): the continuous engine's output equals the static one's row for row (tokens,
mask, lengths, truncation, log-probs), and each slot engine request gets the static row of
its key, for each seed and layer loop. Nothing else is asserted to agree: the turn sampler
and the two episode players draw from other keys (turns_test, `admitted`), and no test
states that the two layer loops agree (here they do, to the 6 decimals recorded).

The record is of this machine's XLA:CPU under the test session's settings
(tests/conftest.py: cheapest codegen, no optimisations). To write it again, after a
deliberate change of the numbers (say why in the commit):

  JAXRL_TEST_DEVICES=1 .venv/bin/python -m tests.sampling.engines_recorded_test --record

The test run only compares.
"""
import atexit
import functools
import json
import os
import re
import shutil
import sys
import tempfile

if __name__ == "__main__":  # recording: the test session's devices and XLA settings
  os.environ.setdefault("JAXRL_TEST_DEVICES", "1")
  from tests import conftest  # noqa: F401  pylint: disable=unused-import

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl.testing import absltest, parameterized  # noqa: E402

from jaxrl_llm import sampling, serving  # noqa: E402
from tests.sampling import continuous_test, turns_test  # noqa: E402
from tests.serving import engine_test  # noqa: E402
from tests.training import admission_test, agent_testing  # noqa: E402

RECORDED = os.path.join(os.path.dirname(__file__), "tokens_recorded.json")
SEEDS = (0, 2)  # (seed 1's admitted episodes all end at their first turn's budget)
LOOPS = ("scan", "unrolled")
G = 2
PROMPTS = engine_test._prompts(0, (5, 9, 3))  # one 16-column bucket for every engine
# The static and continuous engines' settings (continuous_test._sample's, made to match
# the slot engine's requests: engine_test's N new tokens, stop ids, temperature 1, top-p 0.9,
# no top-k, which the slot engine does not take).
SAMPLE = dict(num_samples=G, max_new_tokens=engine_test.N, temperature=1.0, top_p=0.9,
              eos_ids=engine_test.EOS_IDS)
CONTINUOUS = dict(slots=2, page_size=4)  # 6 requests in 2 slots: admitted in waves
SLOTS_LAYOUT = (2, 16, 32, 4, 0)  # slots, page, context, chunk steps, top log-probs
# turns_test's episodes: 3 prompts, 2 scripted replies each, turn budgets turns_test.BUDGETS
# (8 new tokens at most); every turn's new tokens fit one 8-column chunk: one program a loop.
TURN_PROMPTS = engine_test._prompts(1, (5, 8, 2))
TURN_REPLIES = [engine_test._prompts(2 + b, n) for b, n in enumerate(((4, 1), (7, 3), (2, 6)))]
EPISODE_RECORDS = [{"prompt": p} for p in ("fast 3+4", "fast 5+6") for _ in range(2)]
PLAYERS = {"turns": "static", "admitted": "continuous"}  # player -> config.sampling.engine
# The episode players' model (agent_testing's): its end-of-turn token drawn about one time
# in five, so that turns end by it after a few tokens, or at their budget (admission_test's
# 2.5 ends nearly every turn at its first token).
EOS_LOGIT = 0.7
DECIMALS = 6


def _floats(xs) -> list[float]:
  return [round(float(x), DECIMALS) for x in xs]


def _ints(xs) -> list[int]:
  return [int(x) for x in xs]


# -- what each engine plays now ------------------------------------------------------------

def _model():
  return engine_test._model()  # qwen2, TINY, 2 layers, float32


@functools.cache
def _sampler(engine: str, loop: str) -> sampling.Sampler:
  """One sampler, so one program, per engine setting: both seeds run it."""
  kw = CONTINUOUS if engine == "continuous" else {}
  return sampling.Sampler(sampling.SamplingSettings(engine=engine, layer_loop=loop, **SAMPLE,
                                                    **kw))


@functools.cache
def _sampled(engine: str, seed: int, loop: str):
  """The static or continuous engine's `SampleOutput`, on the host."""
  return jax.device_get(_sampler(engine, loop)(_model(), PROMPTS, seed))


def _sample_record(out) -> dict:
  return dict(tokens=[_ints(r) for r in out.tokens], lengths=_ints(out.lengths),
              truncated=[bool(t) for t in out.truncated],
              logprobs=[_floats(r) for r in out.logprobs])


@functools.cache
def _slots(loop: str) -> dict[int, list[serving.Completion]]:
  """The slot engine's completions of the 6 requests for each seed, submitted at once."""
  model = _model()
  layout = engine_test._layout(*SLOTS_LAYOUT)
  settings = sampling.SamplingSettings(
      1, layout.context, eos_ids=engine_test.EOS_IDS, pad_id=0, page_size=layout.page_size,
      layer_loop=loop)
  engine = serving.Engine(model, settings, layout)
  try:
    rows = [p for p in PROMPTS for _ in range(G)]
    return {seed: engine_test._run(engine, engine_test._requests(rows, 1.0, 0.9, seed))
            for seed in SEEDS}
  finally:
    engine.close()


def _slots_record(completions) -> dict:
  return dict(tokens=[c.tokens for c in completions],
              finish_reasons=[c.finish_reason for c in completions],
              logprobs=[_floats(c.logprobs) for c in completions])


@functools.cache
def _turns(seed: int, loop: str):
  return turns_test.play(_model(), TURN_PROMPTS, TURN_REPLIES, turns_test.BUDGETS,
                         layer_loop=loop, seed=seed)


def _turns_record(played) -> dict:
  rows, model_at, logps = played
  return dict(tokens=[_ints(r) for r in rows], model_at=[_ints(a) for a in model_at],
              logprobs=[_floats(lp) for lp in logps])


@functools.cache
def _episode_model_dir() -> str:
  path = tempfile.mkdtemp()
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  return agent_testing.make_model_dir(os.path.join(path, "model"), eos_logit=EOS_LOGIT)


@functools.cache
def _episodes(player_name: str) -> dict:
  """Each seed's episodes of EPISODE_RECORDS by one player (admission_test's `player_of`)."""
  player, model = admission_test.player_of(_episode_model_dir(), PLAYERS[player_name])
  try:
    return {seed: player.play(model, EPISODE_RECORDS, list(range(len(EPISODE_RECORDS))),
                              jax.random.PRNGKey(seed)) for seed in SEEDS}
  finally:
    player.close()


def _episodes_record(played) -> dict:
  return dict(tokens=[_ints(ep.tokens) for ep in played],
              turn_lengths=[_ints(ep.turn_lengths) for ep in played],
              ended=[ep.ended for ep in played],
              logprobs=[_floats(ep.logprobs) for ep in played])


def _case(seed: int, loop: str | None = None) -> str:
  return f"seed {seed}" + (f", {loop}" if loop else "")


# Each seed and layer loop as a named test case (test_slot_engine_seed0_scan, ...).
CASES = [(f"_seed{s}_{loop}", s, loop) for s in SEEDS for loop in LOOPS]


def record() -> dict:
  """What every engine and player plays now, as the JSON holds it."""
  out = {engine: {_case(s, loop): _sample_record(_sampled(engine, s, loop))
                  for s in SEEDS for loop in LOOPS} for engine in ("static", "continuous")}
  out["slots"] = {_case(s, loop): _slots_record(_slots(loop)[s])
                  for s in SEEDS for loop in LOOPS}
  out["turns"] = {_case(s, loop): _turns_record(_turns(s, loop)) for s in SEEDS for loop in LOOPS}
  out["episodes"] = {name: {_case(s): _episodes_record(_episodes(name)[s]) for s in SEEDS}
                     for name in PLAYERS}
  return out


@functools.cache
def _recorded() -> dict:
  if not os.path.exists(RECORDED):
    raise FileNotFoundError(f"{RECORDED}: not recorded yet (module docstring: --record)")
  with open(RECORDED) as f:
    return json.load(f)


# -- the tests -----------------------------------------------------------------------------

class RecordedTest(parameterized.TestCase):

  def assert_recorded(self, want: dict, got: dict, where: str):
    """Every field as recorded; log-probs at atol 1e-5 (rows of any length compared one by
    one: a row's length is recorded in its tokens)."""
    self.assertEqual(sorted(got), sorted(want), where)
    for field, rows in want.items():
      if field != "logprobs":
        self.assertEqual(got[field], rows, f"{where}: {field}")
        continue
      self.assertLen(got[field], len(rows), where)
      for r, (w, g) in enumerate(zip(rows, got[field])):
        self.assertLen(g, len(w), f"{where}: logprobs of row {r}")
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0,
                                   err_msg=f"{where}: logprobs of row {r}")

  @parameterized.named_parameters((f"_{e}{name}", e, s, loop) for e in ("static", "continuous")
                                  for name, s, loop in CASES)
  def test_sampler(self, engine, seed, loop):
    got = _sample_record(_sampled(engine, seed, loop))
    self.assert_recorded(_recorded()[engine][_case(seed, loop)], got,
                         f"{engine}, {_case(seed, loop)}")

  @parameterized.named_parameters(CASES)
  def test_slot_engine(self, seed, loop):
    self.assert_recorded(_recorded()["slots"][_case(seed, loop)],
                         _slots_record(_slots(loop)[seed]), f"slots, {_case(seed, loop)}")

  @parameterized.named_parameters(CASES)
  def test_turn_sampler(self, seed, loop):
    self.assert_recorded(_recorded()["turns"][_case(seed, loop)],
                         _turns_record(_turns(seed, loop)), f"turns, {_case(seed, loop)}")

  @parameterized.named_parameters((f"_{p}_seed{s}", p, s) for p in PLAYERS for s in SEEDS)
  def test_episode_player(self, player, seed):
    self.assert_recorded(_recorded()["episodes"][player][_case(seed)],
                         _episodes_record(_episodes(player)[seed]),
                         f"{player} episodes, {_case(seed)}")


class AgreementTest(parameterized.TestCase):
  """What today's tests say agrees, on the recorded runs."""

  def test_the_record_exercises_both_ends_and_waves(self):
    want = _sampled("static", SEEDS[0], LOOPS[0])
    self.assertTrue(want.truncated.any() and not want.truncated.all())  # stops and budgets
    self.assertGreater(len(PROMPTS) * G, CONTINUOUS["slots"])  # admitted in waves
    self.assertGreater(len(PROMPTS) * G, SLOTS_LAYOUT[0])
    self.assertGreater(max(len(ep.turn_lengths) for ep in _episodes("admitted")[SEEDS[0]]), 1)

  @parameterized.named_parameters(CASES)
  def test_continuous_is_static_row_for_row(self, seed, loop):
    """continuous_test.SameAsStaticTest: tokens, mask, lengths, truncation, log-probs."""
    continuous_test.assert_same(_sampled("static", seed, loop), _sampled("continuous", seed, loop))

  @parameterized.named_parameters(CASES)
  def test_slots_are_static_row_for_row(self, seed, loop):
    """engine_test's "static engine's completion": request r with the key of the static
    call's row r gets that row's tokens, finish reason and log-probs."""
    want = _sampled("static", seed, loop)
    got = _slots(loop)[seed]
    self.assertLen(got, len(want.lengths))
    for r, completion in enumerate(got):
      engine_test.EngineTest.assert_static_row(self, want, r, completion, f"({_case(seed, loop)})")


def main():
  if "--record" in sys.argv[1:]:
    recorded = record()
    text = json.dumps(recorded, indent=1, sort_keys=True)
    # One line per row: the innermost lists (numbers, strings) on one line each.
    text = re.sub(r"\[[^\[\]{}]*\]", lambda m: re.sub(r"\s+", "", m.group()), text)
    with open(RECORDED, "w") as f:
      f.write(text + "\n")
    print(f"wrote {RECORDED} ({os.path.getsize(RECORDED)} bytes)")
    return
  absltest.main()


if __name__ == "__main__":
  main()
