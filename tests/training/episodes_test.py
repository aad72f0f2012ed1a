"""Multi-turn rollouts through the trainer's own pieces: the scripted environment's episodes
laid out as a training batch, whose recorded behaviour log-probs equal the trainer's forward
over the whole episode, with the loss mask on exactly the model's tokens; errors of the
environment stop the run or drop the episode's group, counted."""
import json
import os
import shutil
import tempfile

import numpy as np
from absl.testing import absltest
import transformers

import jax
from jaxrl_llm import config as config_lib
from jaxrl_llm import envs, training
from jaxrl_llm.training import feed as feed_lib
from jaxrl_llm.training import plan as plan_lib
from jaxrl_llm.training import prepare, resume, steps
from jaxrl_llm.training import setup as setup_lib
from tests.training import agent_testing

ENV = agent_testing.SCRIPTED_ENV + ":ScriptedEnv"


def agent_config(model_dir: str, **env_args):
  cfg = config_lib.preset("grpo")
  cfg.model.path = model_dir
  cfg.data.env = ENV
  cfg.data.env_args = env_args
  cfg.data.max_episode_tokens = 80
  cfg.data.max_turns = 4
  cfg.sampling.max_new_tokens = 10
  cfg.sampling.max_prompt_len = 32
  cfg.sampling.prompt_buckets = (16, 32)
  cfg.sampling.num_samples = 4
  cfg.train.prompts_per_step = 4
  cfg.train.micro_batch_size = 16
  cfg.train.logprob_chunk_size = 16
  cfg.train.steps = 2
  cfg.train.eval_every = 0
  cfg.checkpoint.every = 0
  cfg.logging.trackers = ("jsonl",)
  return cfg


def first_rollout(cfg, setup=None, start=None):
  """The first step's rollout, and the set-up it was sampled with (`setup` and `start`: those
  of a config of the same model and tokenizer, reused: the feed reads its models and
  tokenizer alone)."""
  config_lib.validate(cfg, data=True)
  plan = plan_lib.make_plan(cfg)
  if setup is None:
    setup = setup_lib.set_up(cfg, plan)
    start = resume.start_point(setup, None, None, cfg.seed)
  feed = feed_lib.Feed(cfg, plan, setup, start)
  try:
    rollout, _, _ = feed.get(0, start.state.policy_params)
  finally:
    feed.close()
  return rollout, setup, start


class EpisodeRolloutsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.model_dir = agent_testing.make_model_dir(os.path.join(cls.dir, "model"))

  @classmethod
  def tearDownClass(cls):
    cls._echo = cls._failing_setup = None
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  _echo = None  # (config, rollout, setup, start) of `echo_rollout`

  def echo_rollout(self):
    """The first rollout of episodes of up to three turns, with echo on the tool's tokens and
    no KL term: one set-up and one sample, which the tests below read each their own way."""
    cls = type(self)
    if cls._echo is None:
      cfg = agent_config(self.model_dir, replies=2)
      cfg.algo.echo.tool = 0.1
      cfg.algo.kl.coef, cfg.algo.kl.placement = 0.0, "none"
      cls._echo = (cfg, *first_rollout(cfg))
    return cls._echo

  def test_logprobs_equal_the_trainers_forward_and_the_mask_is_the_models_tokens(self):
    cfg, rollout, setup, start = self.echo_rollout()
    arrays = prepare.batch_arrays(rollout, cfg.sampling.num_samples, False)
    model = setup.models.policy.replace(params=start.state.policy_params)
    logp, _ = steps.completion_logp(model, arrays, temperature=cfg.sampling.temperature,
                                    chunk_size=cfg.train.logprob_chunk_size)
    logp = np.asarray(logp)
    mask = arrays.loss_mask > 0
    np.testing.assert_allclose(logp[mask], arrays.sampler_logp[mask], atol=1e-5)
    self.assertTrue(np.all(arrays.sampler_logp[~mask] == 0))
    turns = [row["num_turns"] for row in rollout.episodes.rows]
    self.assertGreater(max(turns), 1, "the test needs multi-turn episodes")
    S0 = rollout.prompt_tokens.shape[1]
    for b, row in enumerate(rollout.episodes.rows):
      opening = row["turn_tokens"][0]
      roles = [r for r, n in zip(row["turn_roles"], row["turn_tokens"]) for _ in range(n)]
      n = len(row["tokens"]) - opening
      self.assertEqual(arrays.tokens[b, S0:S0 + n].tolist(), row["tokens"][opening:])
      # The loss mask: exactly the model's tokens; the attention: every token of the episode.
      self.assertEqual(mask[b, :n].tolist(), [r == "assistant" for r in roles[opening:]])
      self.assertFalse(mask[b, n:].any())
      self.assertEqual(arrays.attention_mask[b, S0:].tolist(), [1] * n + [0] * (80 - n))
      self.assertEqual(row["loss_mask"], [int(r == "assistant") for r in roles])
      # echo weighs the tool's tokens (after the opening) only.
      np.testing.assert_array_equal(arrays.echo_weights[b, :n], np.float32(
          [0.1 if r == "tool" else 0.0 for r in roles[opening:]]))
      self.assertAlmostEqual(rollout.stats.rewards.per_function["env"][b],
                             0.25 * row["num_turns"] if row["ended"] != "max_new_tokens"
                             else 0.25 * (row["num_turns"] - 1))

  def test_the_update_adds_echo_over_its_own_token_count(self):
    cfg, rollout, setup, start = self.echo_rollout()
    arrays = prepare.batch_arrays(rollout, cfg.sampling.num_samples, False)
    model = setup.models.policy.replace(params=start.state.policy_params)
    logp, _ = steps.completion_logp(model, arrays, temperature=cfg.sampling.temperature,
                                    chunk_size=cfg.train.logprob_chunk_size)
    w = arrays.echo_weights
    want = float(np.sum(w * -np.asarray(logp)) / np.count_nonzero(w))
    batch, _, _ = setup.programs.prepare(
        prepare.place_batch(arrays, setup.models.mesh, setup.models.rules), model, None, None,
        None, start.state.baselines)
    _, metrics = setup.programs.update(start.state, batch, np.random.default_rng(0))
    metrics = jax.device_get(metrics[0])
    np.testing.assert_allclose(metrics["echo_loss"], want, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], metrics["pg_loss"] + metrics["echo_loss"]
                               + metrics["kl_loss"] + metrics["entropy_loss"], rtol=1e-5)

  def test_episodes_are_played_ahead_with_asynchronous_rollouts(self):
    cfg = agent_config(self.model_dir, replies=2)
    cfg.algo.max_async_level = 1
    cfg.train.steps = 3
    cfg.train.eval_every = 3
    cfg.data.task_options = dict(num_eval=8)
    cfg.logging.rollouts_every = 1
    workdir = os.path.join(self.dir, "async")
    row = training.train(cfg, workdir)
    with open(os.path.join(workdir, "rollouts.jsonl")) as f:
      versions = sorted({(r["step"], r["policy_version"]) for r in map(json.loads, f)})
    self.assertEqual(versions, [(1, 0), (2, 0), (3, 1)])  # step s from policy s - 2, at most
    self.assertEqual(row["async/staleness_max"], 1.0)
    self.assertIn("env/turns_mean", row)
    # Evaluation plays greedy episodes: the step rewards are its `env` part.
    self.assertEqual(row["eval/reward/env"], 0.25 * (2 + 1))

  def test_turn_rewards_sit_on_each_turns_last_token(self):
    _, rollout, _, _ = self.echo_rollout()  # echo and KL change no sample
    for b, row in enumerate(rollout.episodes.rows):
      mask = rollout.mask[b]
      ends = [t for t in range(len(mask)) if mask[t] and (t + 1 == len(mask) or not mask[t + 1])]
      self.assertLen(ends, row["num_turns"])
      placed = rollout.episodes.turn_rewards[b][ends].tolist()
      self.assertEqual(placed, row["turn_rewards"])
      self.assertEqual(np.count_nonzero(rollout.episodes.turn_rewards[b]),
                       np.count_nonzero(row["turn_rewards"]))

  _failing_setup = None  # (setup, start) of the first `failing` config, reused by the rest

  def failing(self, where: str, on_env_error: str = "stop"):
    """The first rollout of a config whose environment raises in `where` for the first
    prompt. The set-up (the models and programs, which the environment's arguments do not
    change) is made once for every such config."""
    cfg = agent_config(self.model_dir, fail_prompt=self._first_prompt(), fail_in=where)
    cfg.data.on_env_error = on_env_error
    cls = type(self)
    if cls._failing_setup is None:
      config_lib.validate(cfg, data=True)
      setup = setup_lib.set_up(cfg, plan_lib.make_plan(cfg))
      cls._failing_setup = setup, resume.start_point(setup, None, None, cfg.seed)
    return cfg, first_rollout(cfg, *cls._failing_setup)

  def test_an_environment_that_raises_stops_the_run_naming_it(self):
    for where in ("reset", "step"):
      with self.assertRaisesRegex(envs.EnvError,
                                  rf"scripted_env.py:ScriptedEnv'?, record \d+.*{where}\(\) "
                                  "raised RuntimeError: scripted failure"):
        self.failing(where)

  def test_drop_counts_the_failed_episodes_and_their_groups_carry_no_loss(self):
    for where in ("reset", "step"):
      cfg, (rollout, _, _) = self.failing(where, on_env_error="drop")
      G = cfg.sampling.num_samples
      failed = [row["ended"] == "env_error" for row in rollout.episodes.rows]
      self.assertEqual(rollout.metrics["env/dropped"], sum(failed))
      self.assertGreaterEqual(sum(failed[:G]), 1)  # at least the first prompt's episodes
      self.assertFalse(rollout.group_valid[0])
      arrays = prepare.batch_arrays(rollout, G, False)
      self.assertFalse(arrays.loss_mask[:G].any())
      self.assertTrue(arrays.loss_mask[G:].any())

  def _first_prompt(self) -> str:
    """The first prompt a run of `agent_config` samples (the environment's arguments do not
    change which: the shared rollout's)."""
    _, rollout, _, _ = self.echo_rollout()
    return rollout.prompts[0]

  def test_a_template_that_rewrites_earlier_turns_is_refused_in_one_line(self):
    model_dir = os.path.join(self.dir, "rewriting")
    shutil.copytree(self.model_dir, model_dir)
    # Drops earlier assistant turns' text, as templates that strip reasoning do.
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'][0] | upper }}:{% if m['role'] == 'assistant' and "
        "not loop.last %}...{% else %}{{ m['content'] }}{% endif %}{{ eos_token }} {% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}")
    tokenizer.save_pretrained(model_dir)
    with self.assertRaisesRegex(config_lib.ConfigError, "not append-only") as e:
      config_lib.validate(agent_config(model_dir), data=True)
    self.assertNotIn("\n", str(e.exception))

  def test_bad_fields_are_refused_naming_them(self):
    for field, value, pattern in (("max_turns", 0, "config.data.max_turns=0"),
                                  ("on_env_error", "skip", "config.data.on_env_error='skip'"),
                                  ("env_workers", 0, "config.data.env_workers=0"),
                                  ("tool_timeout_s", -1.0, "config.data.tool_timeout_s=-1.0")):
      cfg = agent_config(self.model_dir)
      cfg.data[field] = value
      with self.assertRaisesRegex(config_lib.ConfigError, pattern):
        config_lib.validate(cfg)
    cfg = config_lib.preset("grpo")
    cfg.algo.echo.tool = 0.1
    with self.assertRaisesRegex(config_lib.ConfigError, "config.algo.echo.tool=0.1"):
      config_lib.validate(cfg)
    cfg = agent_config(self.model_dir)
    cfg.algo.dynamic_sampling.enabled = True
    with self.assertRaisesRegex(config_lib.ConfigError, "config.algo.dynamic_sampling.enabled"):
      config_lib.validate(cfg)
    cfg = config_lib.preset("grpo")
    with cfg.sources.unlocked():
      cfg.sources.agent = config_lib.source_config("task:arithmetic")
      cfg.sources.agent.env = ENV
      cfg.sources.plain = config_lib.source_config("task:arithmetic")
    with self.assertRaisesRegex(config_lib.ConfigError, r"config.sources \['plain'\] have no env"):
      config_lib.validate(cfg)
    cfg = agent_config(self.model_dir)
    cfg.data.env = "no/such/env.py:Env"
    with self.assertRaisesRegex(config_lib.ConfigError, "no/such/env.py:Env"):
      config_lib.validate(cfg, data=True)


if __name__ == "__main__":
  absltest.main()
