"""Routing replay on an MoE policy in bf16: the sampler records its experts, and with
`config.algo.routing_replay='rollout'` the first pass routes every token as the sampler did
(routing_mismatch 0), for GSPO's sequence ratio and for GRPO's token ratio."""
import json
import os
from unittest import mock

import numpy as np
import pytest

from absl.testing import absltest, parameterized

from configs import grpo, gspo
from jaxrl_llm import training
from jaxrl_llm.config import ConfigError, validate
from jaxrl_llm.training import feed as feed_lib
from tests.training import agent_testing, agents_test, episodes_test
from tests.training.run_logs import assert_rows_close, read_jsonl, resume_from_step_two

PRESETS = {"gspo": gspo, "grpo": grpo}

pytestmark = pytest.mark.slow_file(
    "each test trains (or samples) a bf16 Qwen3-MoE with routing replay, whose programs "
    "compile for seconds each: the replayed and the measured first pass, a resume with either "
    "expert kernel, the episode players and an agent program")


def moe_bf16(preset: str, replay: str, engine: str = "static"):
  """A preset's first pass (one minibatch, one step) in bf16 on a random Qwen3-MoE."""
  c = PRESETS[preset].get_config("runlocal")
  a = c.model.arch
  a.model_type, a.num_experts, a.num_experts_per_tok, a.moe_intermediate_size = (
      "qwen3_moe", 8, 2, 64)
  a.hidden_size, a.intermediate_size, a.num_layers, a.num_heads, a.num_kv_heads, a.head_dim = (
      128, 256, 2, 4, 2, 32)
  c.model.dtype = "bfloat16"
  c.algo.num_minibatches, c.algo.routing_replay = 1, replay
  c.train.steps, c.train.prompts_per_step = 1, 4  # 16 completions show the routes
  c.sampling.max_new_tokens, c.sampling.temperature, c.sampling.engine = 16, 0.7, engine
  c.logging.trackers = ("jsonl",)
  return c


class RoutingReplayTest(parameterized.TestCase):

  def _first_pass(self, config):
    workdir = self.create_tempdir().full_path
    training.train(config, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      return [json.loads(line) for line in f][-1]

  @parameterized.parameters("static", "continuous")
  @pytest.mark.slow("a bf16 MoE run's first pass (its programs compile for seconds each), "
                    "replayed and, on the static engine, measured: two runs")
  def test_replay_routes_as_the_sampler(self, engine):
    preset = "gspo"  # the sequence-level trust region, the narrowest
    replayed = self._first_pass(moe_bf16(preset, "rollout", engine))
    self.assertEqual(replayed["moe/routing_mismatch"], 0.0)
    self.assertLessEqual(replayed["clip_frac"], 0.01)
    for key in ("moe/aux_loss", "moe/z_loss", "moe/expert_load_max"):
      self.assertIn(key, replayed)
    self.assertGreaterEqual(replayed["moe/expert_load_max"], 1 / 8)
    if engine == "continuous":  # the record is the static engine's (tests/sampling)
      return
    live = self._first_pass(moe_bf16(preset, "off"))  # measured, not replayed
    self.assertGreaterEqual(live["moe/routing_mismatch"], 0.0)
    print(f"{preset}: routing_mismatch replay {replayed['moe/routing_mismatch']:.4f} / off "
          f"{live['moe/routing_mismatch']:.4f}; clip_frac replay {replayed['clip_frac']:.4f} / "
          f"off {live['clip_frac']:.4f}")

  @pytest.mark.slow("an MoE run of four steps and two resumes from its step 2 (one with the "
                    "other expert kernel, its own programs): a resume needs step 4 to show the "
                    "optimizer state came back")
  def test_an_moe_run_resumes_exactly(self):
    """Steps 3 and 4 after a resume from step 2's checkpoint: the MoE's stacks, its
    optimizer state and the replayed routing come back as they were, with the same expert
    kernel or the other."""
    config = moe_bf16("grpo", "rollout")
    config.model.dtype = "float32"
    config.model.arch.num_layers = 2
    config.train.steps, config.checkpoint.every = 4, 2
    config.sampling.max_new_tokens = 8
    first = self.create_tempdir().full_path
    training.train(config, first)
    rows = read_jsonl(first)
    resumed = resume_from_step_two(config, first, self.create_tempdir().full_path)
    self.assertEqual([r["step"] for r in resumed], [1, 2, 3, 4])
    self.assertTrue(all("moe/aux_loss" in r for r in rows[2:]))
    assert_rows_close(rows[2:], resumed[2:], rtol=1e-5, atol=1e-6)
    # The expert kernel is a speed setting: the run resumes with the other one (the CPU's
    # 'auto' is 'blocked') and computes the same steps.
    config.model.moe_impl = "ragged"
    other = resume_from_step_two(config, first, self.create_tempdir().full_path)
    self.assertEqual([r["step"] for r in other], [1, 2, 3, 4])
    assert_rows_close(rows[2:], other[2:], rtol=1e-4, atol=1e-5)

  @parameterized.parameters("static", "continuous")
  @pytest.mark.slow("samples multi-turn episodes with a bf16 MoE (and trains one step on them "
                    "on the continuous engine): the MoE's programs compile for seconds each")
  def test_episodes_record_and_replay(self, engine):
    """A multi-turn bf16 run on a random Qwen3-MoE: each episode player (turn-synchronous,
    or admitting episodes one at a time) records the experts of every token it fed (prompt,
    turns, environment replies), and the first pass replays them (routing_mismatch 0)."""
    model_dir = agent_testing.make_model_dir(self.create_tempdir().full_path, moe=True)
    cfg = episodes_test.agent_config(model_dir, replies=2)
    cfg.model.dtype, cfg.sampling.engine, cfg.algo.routing_replay = "bfloat16", engine, "rollout"
    cfg.train.steps = 1
    cfg.train.update(prompts_per_step=2, micro_batch_size=8)  # 8 episodes show every kind of token
    if engine == "static":  # the update reads either player's record the same way
      rollout, _, _ = episodes_test.first_rollout(cfg)
      self.assert_every_fed_token_recorded(rollout)
      return
    self.assert_every_fed_token_recorded(self.assert_replayed(cfg))

  @pytest.mark.slow("an agent program's episodes through the endpoint of a bf16 MoE and a "
                    "training step on them: the engine's and the step's MoE programs compile "
                    "for seconds each")
  def test_agent_programs_record_and_replay(self):
    """An agent program's calls through the endpoint (two per episode, the second continuing
    the first after a user turn): each trajectory's last call carries the experts of the
    whole trajectory, and the first pass replays them."""
    tmp = self.create_tempdir().full_path
    agent_file = os.path.join(tmp, "agent.py")
    with open(agent_file, "w") as f:
      f.write(agents_test.AGENT)
    cfg = episodes_test.agent_config(agent_testing.make_model_dir(
        os.path.join(tmp, "model"), moe=True, eos_logit=2.0))
    cfg.data.env, cfg.data.agent, cfg.data.env_workers = "", f"{agent_file}:run", 8
    cfg.model.dtype, cfg.algo.routing_replay, cfg.train.steps = "bfloat16", "rollout", 1
    cfg.train.update(prompts_per_step=2, micro_batch_size=8)  # 8 episodes, 16 calls
    self.assert_every_fed_token_recorded(self.assert_replayed(cfg))

  def assert_every_fed_token_recorded(self, rollout):
    """The first rollout records the experts of every token fed in its completion region
    (the model's and the inserted ones), none elsewhere."""
    S0, N = rollout.prompt_tokens.shape[1], rollout.tokens.shape[1]
    self.assertEqual(rollout.routing.shape[:2], (rollout.tokens.shape[0], S0 + N))
    attended = rollout.attention > 0
    fed = attended & np.roll(attended, -1, axis=1)  # every attended token but a row's last
    recorded = (rollout.routing[:, S0:] >= 0).all(axis=(2, 3))
    self.assertTrue(recorded[fed].all() and not recorded[~attended].any())
    inserted = rollout.episodes.attention.sum() - rollout.mask.sum()
    self.assertGreater(inserted, 0)  # environment replies or the agent's user turns

  def assert_replayed(self, cfg):
    """Trains `cfg`'s one step, checks its first pass replayed the sampler's routing, and
    returns the step's rollout (the one `episodes_test.first_rollout` samples: step 0 from
    the initial weights), read off the run's feed rather than sampled again."""
    rollouts, get = [], feed_lib.Feed.get

    def recording_get(feed, step, params):
      got = get(feed, step, params)
      rollouts.append(got[0])
      return got

    workdir = self.create_tempdir().full_path
    with mock.patch.object(feed_lib.Feed, "get", recording_get):
      training.train(cfg, workdir)
    self.assertEqual(read_jsonl(workdir)[-1]["moe/routing_mismatch"], 0.0)
    self.assertLen(rollouts, 1)
    return rollouts[0]

  def test_replay_needs_an_moe_policy_and_no_partial_rollouts(self):
    c = moe_bf16("grpo", "rollout")
    c.model.arch.model_type = "llama"
    with self.assertRaisesRegex(ConfigError, r"routing_replay='rollout'.*not a mixture"):
      validate(c)
    c = moe_bf16("grpo", "rollout")
    c.algo.max_async_level, c.rollouts.partial = 1, True
    with self.assertRaisesRegex(ConfigError, r"rollouts.partial=True: .*reroutes"):
      validate(c)
    c = moe_bf16("grpo", "sometimes")
    with self.assertRaisesRegex(ConfigError, r"routing_replay.*'off', 'rollout'"):
      validate(c)


if __name__ == "__main__":
  absltest.main()
