"""Partial rollouts of episodes (`rollouts.partial_episodes`): episodes whose turns span weight
publishes, each step's batch the first groups to end. Every model turn records the version
that sampled it, and its behaviour log-probs equal one forward of that version over the
episode before it (float32, 1e-5); no sample's oldest token is older than the bound; a run
through the trainer logs the mix of versions and resumes from a checkpoint taken with
episodes in flight."""
import itertools
import json
import os
import shutil
import tempfile
import threading
import time

import jax
import numpy as np
import pytest
from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm import checkpoints, data, models, sampling, training
from jaxrl_llm.aot import chips
from jaxrl_llm.training import plan as plan_lib
from jaxrl_llm.training import rollouts
from tests.training import agent_testing
from tests.training.agents_test import log_softmax_of
from tests.training.episodes_test import agent_config
from tests.training.run_logs import read_jsonl, resume_from_step_two

WIDTH = 128  # tokens a forward of the test reads (more than max_episode_tokens)
DELAY = 0.05  # seconds each environment step takes: episodes are in flight at publishes
RECORDS = [{"prompt": f"{a}+{b}", "answer": str(a + b)} for a, b in itertools.product(range(1, 5), range(1, 5))]


def partial_config(model_dir: str, gates: dict | None = None):
  """`gates`: scripted_env.TimedEnv's, by prompt."""
  cfg = agent_config(model_dir, replies=3, delays={r["prompt"]: DELAY for r in RECORDS},
                     gates=gates or {})
  cfg.data.env = agent_testing.SCRIPTED_ENV + ":TimedEnv"
  cfg.data.env_workers = 16
  cfg.data.max_turns = 5
  cfg.sampling.num_samples = 2
  cfg.train.prompts_per_step = 4
  cfg.train.micro_batch_size = 8
  cfg.algo.max_async_level = 1
  cfg.rollouts.partial = True
  return cfg


def batches(P: int):
  """Prompt batches of P records each, for ever."""
  for position in itertools.count():
    chosen = [RECORDS[(position * P + p) % len(RECORDS)] for p in range(P)]
    yield data.RecordBatch(position, np.arange(position * P, (position + 1) * P), chosen,
                           np.ones(P, bool), None, None)


def wait_until(condition, what: str, timeout: float = 120) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      raise AssertionError(f"waited {timeout} s for {what}")
    time.sleep(0.005)


def open_gates_at_the_publish(players, version: int) -> threading.Thread:
  """Raises the environments' `opened` to `version` once every engine has taken that
  version's weights (a publish waits for the turns decoding, then swaps the weights)."""
  def open_them():
    wait_until(lambda: all(p.engine.version >= version for p in players),
               f"version {version}'s publish")
    for player in players:
      for env in player.envs:
        env.opened = version
  opener = threading.Thread(target=open_them, daemon=True)
  opener.start()
  return opener


def turn_spans(row: dict) -> list[tuple[int, int]]:
  """(first token, end) of each model turn in an episode's row."""
  spans, at = [], 0
  for role, n in zip(row["turn_roles"], row["turn_tokens"]):
    if role == "assistant":
      spans.append((at, at + n))
    at += n
  return spans


def records_read(first: str, workdir: str) -> list[str]:
  """The prompts of every group trained by step 4 (steps 1-2 from `first`, as a resumed run
  keeps them) and of those in flight at its step-4 checkpoint, sorted."""
  def trained(path, steps):
    with open(os.path.join(path, "rollouts.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    return [r["messages"][0]["content"] for r in rows if r["step"] in steps][::2]  # G = 2
  in_flight = [json.loads(text) for text in
               checkpoints.Reader(workdir).read_meta(4)["in_flight"]]
  return sorted(trained(first, (1, 2)) + trained(workdir, (3, 4)) +
                [g["record"]["prompt"] for snap in in_flight for g in snap["groups"].values()])


class PartialEpisodesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.model_dir = agent_testing.make_model_dir(os.path.join(cls.dir, "model"), eos_logit=2.5)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  @pytest.mark.slow("four rollouts of partial episodes whose environments take time (and wait "
                    "at gates, so that turns span publishes), each turn checked against a "
                    "forward of its version")
  def test_turns_span_versions_each_token_exact_within_the_bound(self):
    # Turns span a publish by construction (TimedEnv's gates): the second batch's episodes
    # (queued at step 0) sample their first turn under version 0, then wait in their
    # environment's first step until version 1's weights are in place; the third batch's
    # start at step 2, so that step 1 takes its groups from the first two batches.
    P = 4
    gates = ({r["prompt"]: (0, 1) for r in RECORDS[P:2 * P]} |
             {r["prompt"]: (2, 0) for r in RECORDS[2 * P:3 * P]})
    cfg = partial_config(self.model_dir, gates)
    self.assertEqual(cfg.train.prompts_per_step, P)
    config_lib.validate(cfg, data=True)
    plan = plan_lib.make_plan(cfg)
    tokenizer = data.load_tokenizer(self.model_dir)
    base = models.from_pretrained(self.model_dir)
    settings = sampling.settings.from_config(
        cfg.sampling, sampling.eos_ids(tokenizer, base.config), sampling.pad_id(tokenizer))
    source = rollouts.for_plan(plan, settings, data.PromptFormat.from_config(cfg), tokenizer,
                               batches(cfg.train.prompts_per_step))
    self.assertIsInstance(source, rollouts.PartialEpisodeRollouts)
    # Version v: the weights scaled by 1 + v / 10 (each version samples differently).
    versions = [models.Model(jax.tree.map(lambda x, v=v: x * (1 + v / 10), base.params),
                             base.config) for v in range(4)]
    rows = []
    envs = [env for player in source.players for env in player.envs]
    try:
      for step, model in enumerate(versions):
        if step == 1:
          wait_until(lambda: sum(env.waiting for env in envs) > 0,
                     "an episode of the second batch to wait at its gate after turn 1")
          open_gates_at_the_publish(source.players, step)
        else:
          for env in envs:
            env.opened = step
        rollout = source.finish((step, step, jax.random.PRNGKey(step), model))
        self.assertGreaterEqual(rollout.policy_version, step - 1)  # the oldest token's
        lags = [rollout.metrics[f"partial/tokens_lag_{j}"] for j in range(2)]
        self.assertAlmostEqual(sum(lags), 1.0, 6)
        rows += [(step, row) for row in rollout.episodes.rows]
    finally:
      for env in envs:  # no environment waits for ever, whatever stopped the test
        env.opened = len(versions)
      source.close()
    spanning = 0
    for step, row in rows:
      turns = turn_spans(row)
      self.assertLen(row["turn_versions"], len(turns))
      self.assertGreaterEqual(min(row["turn_versions"]), step - 1)
      spanning += len(set(row["turn_versions"])) > 1
      logprobs = np.asarray(row["behaviour_logprobs"])
      # One forward of each version over the episode (padded to one length: the model is
      # causal, so a turn's log-probs are those of the episode up to the turn's end).
      padded = row["tokens"] + [0] * (WIDTH - len(row["tokens"]))
      logps = {v: log_softmax_of(versions[v], padded) for v in set(row["turn_versions"])}
      for (a, b), v in zip(turns, row["turn_versions"]):
        logp = logps[v]
        np.testing.assert_allclose(logp[a - 1:b - 1], logprobs[a:b], atol=1e-5,
                                   err_msg=f"step {step}, turn at {a}, version {v}")
    self.assertGreater(spanning, 0, "the test needs episodes that span a publish")

  def test_a_run_logs_the_versions_and_resumes_with_episodes_in_flight(self):
    cfg = partial_config(self.model_dir)
    cfg.train.steps = 4
    cfg.checkpoint.every = 2
    cfg.logging.rollouts_every = 1
    first = self.create_tempdir().full_path
    training.train(cfg, first)
    rows = read_jsonl(first)
    self.assertEqual([r["step"] for r in rows], [1, 2, 3, 4])
    for r in rows:
      self.assertLessEqual(r["async/staleness_max"], 1)
      self.assertAlmostEqual(r["partial/tokens_lag_0"] + r["partial/tokens_lag_1"], 1.0, 6)
      self.assertTrue(np.isfinite(r["loss"]), r)
    self.assertGreater(rows[1]["partial/in_flight"], 0)  # the step-2 checkpoint kept some
    # Resumed: the groups in flight are played again from their reset (not token-exact:
    # which version samples a turn depends on when environments answer). Each step queues
    # one batch (step s the (s + 1)-th), so both runs read the same batches: the records trained by step 4 and
    # those in flight then are the same, none skipped or trained twice.
    second = self.create_tempdir().full_path
    resumed = resume_from_step_two(cfg, first, second)
    self.assertEqual([r["step"] for r in resumed], [1, 2, 3, 4])
    self.assertEqual(records_read(first, first), records_read(first, second))
    self.assertLen(records_read(first, first), 5 * cfg.train.prompts_per_step)  # batches 0-4

  def test_the_turn_synchronous_player_and_agent_programs_are_refused(self):
    cfg = partial_config(self.model_dir)
    cfg.sampling.engine = "static"
    with self.assertRaisesRegex(config_lib.ConfigError, r"rollouts.partial.*'continuous'"):
      config_lib.validate(cfg, data=True)

  def test_auto_on_a_tpu_is_refused_before_anything_loads(self):
    """Validation asks `sampling.engine_kind` for the mesh's platform: 'auto' plays episodes
    in lockstep on a TPU (a slice's chips stand in for its devices here)."""
    cfg = partial_config(self.model_dir)  # engine 'auto'
    tpu = chips.slice_chips("v5e:2x2")
    with self.assertRaises(config_lib.ConfigError) as refused:
      config_lib.validate(cfg, devices=tpu)
    self.assertEqual(str(refused.exception),
                     "config.rollouts.partial=True: expected False, or "
                     "sampling.engine='continuous' (episodes span publishes on the slot engine; "
                     "sampling.engine='auto' plays them turn by turn in lockstep on tpu)")
    cfg.sampling.engine = "continuous"
    config_lib.validate(cfg, devices=tpu)


if __name__ == "__main__":
  absltest.main()
