"""Agent programs (`config.data.agent`): plain `openai`-client loops that reach the policy
through its own endpoint. Their episodes are assembled from the endpoint's log: a chain of
calls that continue one another is one token-exact trajectory whose behaviour log-probs
equal the trainer's forward; a template that rewrites earlier turns leaves the earlier calls
out of the trajectory (counted); an agent that raises stops the run or is dropped, one that
hangs is cancelled, and the CLI trains one end to end."""
import json
import os
import shutil
import tempfile
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm import data, envs, models, sampling, serving
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.training import prepare, steps
from jaxrl_llm.training.rollouts import agents, episodes
from tests import cli_runs
from tests.training import agent_testing
from tests.training.episodes_test import agent_config, first_rollout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT = textwrap.dedent('''
    import asyncio

    async def run(client, record):
      """Asks, then asks again after a user turn: two calls per episode unless cut."""
      messages = [{"role": "user", "content": record["prompt"]}]
      for _ in range(2):
        response = await client.chat.completions.create(model="anything", messages=messages)
        choice = response.choices[0]
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.finish_reason != "stop":
          break
        messages.append({"role": "user", "content": "and?"})
      turns = sum(m["role"] == "assistant" for m in messages)
      return 0.5 * turns, {"turns": turns}

    async def hang(client, record):
      await asyncio.sleep(1000)

    async def boom(client, record):
      await client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
      raise RuntimeError("the harness broke")

    async def silent(client, record):
      return 1.0

    async def chatty(client, record):
      """Ten calls, whatever comes back; the reward counts the answers that were sampled."""
      messages, sampled = [{"role": "user", "content": record["prompt"]}], 0
      for _ in range(10):
        response = await client.chat.completions.create(model="x", messages=messages)
        sampled += bool(response.choices[0].model_extra["token_ids"])
        messages += [{"role": "assistant", "content": response.choices[0].message.content},
                     {"role": "user", "content": "more"}]
      return float(sampled)
''')
# CHAR_TOOL_CHAT_TEMPLATE, but an earlier assistant turn renders as '...' (as Qwen3's drops
# earlier <think> blocks): the next call's prompt does not extend the previous tokens.
REWRITING = envs.CHAR_TOOL_CHAT_TEMPLATE.replace(
    "{{ message['content'] }}",
    "{% if message['role'] == 'assistant' and not loop.last %}...{% else %}"
    "{{ message['content'] }}{% endif %}")


def counts(**nonzero) -> dict[str, int]:
  """An agent player's `tool_stats`: every count, zero but `nonzero`."""
  return {name: nonzero.get(name, 0) for name in agents.COUNTS}


WIDTH = 128  # tokens `log_softmax_of` reads (more than any test's episode)


def log_softmax_of(model, tokens):
  """The policy's float32 log-probs of each token given those before it: one forward over the
  tokens padded to WIDTH (the model is causal, so the padding changes none of them), one
  compiled program for every length."""
  n, width = len(tokens), max(WIDTH, len(tokens))
  ids = jnp.asarray([list(tokens) + [0] * (width - n)], jnp.int32)
  mask = jnp.ones_like(ids)
  logits, _ = models.forward(model, ids, models.positions_from_mask(mask), mask)
  logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)
  return np.asarray(logp[jnp.arange(width - 1), ids[0, 1:]])[:n - 1]


class AgentEpisodesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    cls.model_dir = agent_testing.make_model_dir(os.path.join(cls.dir, "model"), eos_logit=2.0)
    cls.rewriting_dir = agent_testing.make_model_dir(os.path.join(cls.dir, "rewriting"),
                                                     eos_logit=2.0, chat_template=REWRITING)
    cls.agent_file = os.path.join(cls.dir, "agent.py")
    with open(cls.agent_file, "w") as f:
      f.write(AGENT)

  @classmethod
  def tearDownClass(cls):
    cls.setups.clear()
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  def config(self, model_dir, program="run", **fields):
    cfg = agent_config(model_dir)
    cfg.data.env = ""
    cfg.data.agent = f"{self.agent_file}:{program}"
    cfg.data.env_workers = 8
    for k, v in fields.items():
      cfg.data[k] = v
    return cfg

  setups = {}  # model directory -> (set-up, start) of its first `token_exact_rollout`

  def token_exact_rollout(self, cfg, rows_per_prompt: int = 4):
    """The first step's rollout and batch, checked: the recorded behaviour log-probs equal
    the trainer's forward on the loss mask's tokens. One set-up per model directory."""
    if cfg.model.path in self.setups:
      rollout, setup, start = first_rollout(cfg, *self.setups[cfg.model.path])
    else:
      rollout, setup, start = first_rollout(cfg)
      self.setups[cfg.model.path] = setup, start
    arrays = prepare.batch_arrays(rollout, rows_per_prompt, False)
    model = setup.models.policy.replace(params=start.state.policy_params)
    logp, _ = steps.completion_logp(model, arrays, temperature=cfg.sampling.temperature,
                                    chunk_size=cfg.train.logprob_chunk_size)
    mask = arrays.loss_mask > 0
    np.testing.assert_allclose(np.asarray(logp)[mask], arrays.sampler_logp[mask], atol=1e-5)
    # Every model token is trained, those the group's episodes share included (the prompt
    # of a group is what their openings share, never a model token).
    self.assertEqual(mask.sum(axis=1).tolist(),
                     [sum(row["loss_mask"]) for row in rollout.episodes.rows])
    return rollout, arrays

  def test_chained_calls_are_one_trajectory_whose_logprobs_equal_the_trainers_forward(self):
    rollout, _ = self.token_exact_rollout(self.config(self.model_dir))
    rows = rollout.episodes.rows
    two_calls = [r for r in rows if r["num_turns"] == 2]
    self.assertNotEmpty(two_calls, "the test needs episodes of two calls")
    for row in two_calls:
      # opening, the model's answer, the user's 'and?' (attended, not trained), the answer.
      self.assertEqual(row["turn_roles"], ["prompt", "assistant", "user", "assistant"])
      self.assertEqual(row["messages"][2], {"role": "user", "content": "and?"})
    rewards = rollout.stats.rewards.per_function["env"]
    np.testing.assert_allclose(rewards, [0.5 * r["num_turns"] for r in rows])
    self.assertEqual(rollout.stats.episodes.tool_stats["agent_untrained_calls"].sum(), 0)
    self.assertEqual(rollout.stats.episodes.tool_stats["agent_calls"].sum(),
                     sum(r["num_turns"] for r in rows))

  def test_a_template_that_rewrites_earlier_turns_trains_the_last_call_alone(self):
    rollout, _ = self.token_exact_rollout(self.config(self.rewriting_dir))
    rows = rollout.episodes.rows
    # Every episode is one call in the batch; the second calls' prompts hold '...' for the
    # first answer, as the template rendered it.
    self.assertTrue(all(r["num_turns"] == 1 for r in rows))
    second = [r for r in rows if r["messages"][-2:-1] == [{"role": "user", "content": "and?"}]]
    self.assertNotEmpty(second, "the test needs episodes of two calls")
    tokenizer = data.load_tokenizer(self.rewriting_dir)
    self.assertIn("A:...<eos> U:and?", tokenizer.decode(second[0]["tokens"]))
    unchained = rollout.stats.episodes.tool_stats["agent_untrained_calls"].sum()
    self.assertEqual(unchained, len(second))

  def test_with_agent_samples_each_trajectory_is_its_own_row_with_the_episodes_reward(self):
    rollout, arrays = self.token_exact_rollout(  # G = 4 episodes x K = 2 rows
        self.config(self.rewriting_dir, agent_samples=2), rows_per_prompt=8)
    self.assertEqual(arrays.tokens.shape[0], 4 * 8)
    rows = rollout.episodes.rows
    rewards = rollout.rewards.reshape(-1, 2)
    np.testing.assert_array_equal(rewards[:, 0], rewards[:, 1])  # an episode's two rows
    firsts, lasts = rows[0::2], rows[1::2]
    split = [(a, b) for a, b in zip(firsts, lasts) if a["tokens"]]
    self.assertNotEmpty(split, "the test needs episodes of two calls")
    for a, b in split:  # the first call's own sample, then the second call's
      self.assertEqual(a["messages"][-1]["role"], "assistant")
      self.assertEqual(b["messages"][-2], {"role": "user", "content": "and?"})
      self.assertEqual(rewards[rows.index(b) // 2, 0], 1.0)  # 0.5 x two answers
    for a, b in zip(firsts, lasts):
      if not a["tokens"]:  # one call: an empty first row, no loss
        self.assertFalse(arrays.loss_mask[rows.index(a)].any())
    stats = rollout.stats.episodes.tool_stats
    self.assertEqual(stats["agent_untrained_calls"].sum(), 0)
    self.assertEqual(stats["agent_samples"].sum(), stats["agent_calls"].sum())

  def player(self, program, **fields):
    cfg = self.config(self.model_dir, program, **fields)
    source = sources_lib.run_sources(cfg)[0]
    tokenizer = data.load_tokenizer(self.model_dir)
    policy = models.from_pretrained(self.model_dir)
    settings = sampling.settings.from_config(cfg.sampling, sampling.eos_ids(tokenizer, policy.config),
                                             sampling.pad_id(tokenizer))
    return agents.AgentPlayer(source, tokenizer, settings), episodes.local_model(policy)

  def test_an_agent_that_raises_stops_the_run_or_is_dropped(self):
    player, model = self.player("boom")
    try:
      with self.assertRaisesRegex(envs.EnvError, r"agent '.*agent.py:boom', record 7: the "
                                  r"agent raised RuntimeError: the harness broke"):
        player.play(model, [{"prompt": "1+1"}], [7], jax.random.PRNGKey(0))
    finally:
      player.close()
    player, model = self.player("boom", on_env_error="drop")
    try:
      played = player.play(model, [{"prompt": "1+1"}] * 3, [0, 1, 2], jax.random.PRNGKey(0))
      self.assertEqual([ep.ended for ep in played], ["env_error"] * 3)
      self.assertEqual(player.tool_stats(), counts(agent_calls=3, agent_errors=3))
    finally:
      player.close()

  def test_an_agent_that_hangs_is_cancelled_and_one_that_never_calls_is_dropped(self):
    player, model = self.player("hang", agent_timeout_s=0.5)
    try:
      played = player.play(model, [{"prompt": "1+1"}] * 2, [0, 1], jax.random.PRNGKey(0))
      self.assertEqual([ep.ended for ep in played], ["env_error"] * 2)
      self.assertEqual(player.tool_stats(), counts(agent_timeouts=2))
    finally:
      player.close()
    player, model = self.player("silent")
    try:
      played = player.play(model, [{"prompt": "1+1"}], [0], jax.random.PRNGKey(0))
      self.assertEqual(played[0].ended, "env_error")
      self.assertEqual(player.tool_stats(), counts(agent_no_calls=1))
    finally:
      player.close()

  def test_calls_past_max_turns_are_answered_empty_and_end_the_episode(self):
    player, model = self.player("chatty", max_turns=2)
    try:
      played = player.play(model, [{"prompt": "1+1"}] * 2, [0, 1], jax.random.PRNGKey(0))
      for ep in played:
        self.assertEqual(ep.ended, "max_turns")
        self.assertLessEqual(ep.num_turns, 2)
        self.assertEqual(ep.turn_rewards[-1], 2.0)  # two calls were sampled, eight cut
      self.assertEqual(player.tool_stats()["agent_calls"], 4)
    finally:
      player.close()

  def test_episode_from_calls_follows_the_chain_to_the_last_call(self):
    choice = lambda tokens, text: serving.Choice(tokens, [-0.5] * len(tokens), text,
                                                 {"role": "assistant", "content": text}, "stop", 0)
    user = [{"role": "user", "content": "q"}]
    first = serving.Call(user, None, [9, 9], [choice([5, 3], "a")])
    chained = serving.Call(user + [{"role": "assistant", "content": "a"},
                                   {"role": "tool", "content": "r"}], None,
                           [9, 9, 5, 3, 7, 7], [choice([6, 3], "b")], extends=(0, 0),
                           added_roles=("tool",))
    ep, unchained = agents.episode_from_calls([first, chained], end_of_turn=3, eos=None,
                                              width=64)
    self.assertEqual((ep.tokens, unchained, ep.ended), ([9, 9, 5, 3, 7, 7, 6, 3], 0, "done"))
    self.assertEqual(ep.roles, ["prompt"] * 2 + ["assistant"] * 2 + ["tool"] * 2
                     + ["assistant"] * 2)
    self.assertEqual(ep.logprobs, [0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5])
    self.assertEqual(ep.messages[-2:], [{"role": "tool", "content": "r"},
                                        {"role": "assistant", "content": "b"}])
    fresh = serving.Call(user, None, [8, 8, 8], [choice([4], "c")])  # rendered whole: cut
    ep, unchained = agents.episode_from_calls([first, chained, fresh], 3, None, 64)
    self.assertEqual((ep.tokens, unchained, ep.ended), ([8, 8, 8, 4], 2, "max_new_tokens"))


class AgentConfigTest(absltest.TestCase):
  """What `validate` refuses of an agent source, one line naming the field."""

  def refused(self, message, **fields):
    cfg = config_lib.preset("grpo")
    cfg.data.agent = "jaxrl_llm.envs.calculator_agent:run"
    for path, value in fields.items():
      section, key = path.split("__")
      cfg[section][key] = value
    with self.assertRaises(config_lib.ConfigError) as caught:
      config_lib.validate(cfg)
    self.assertIn(message, str(caught.exception))

  def test_refusals(self):
    config_lib.validate(_agent_preset())
    self.refused("config.data.agent='jaxrl_llm.envs.calculator_agent:run': expected '' while "
                 "data.env='jaxrl_llm.envs.calculator:CalculatorEnv' is set",
                 data__env="jaxrl_llm.envs.calculator:CalculatorEnv")
    self.refused("config.data.agent='jaxrl_llm.envs.calculator_agent:calc': expected an "
                 "`async def run(client, record)`", data__agent="jaxrl_llm.envs.calculator_agent:calc")
    self.refused("config.data.agent_timeout_s=0.0: expected a positive number",
                 data__agent_timeout_s=0)
    self.refused("config.sampling.top_k=20: expected 0 with an agent program", sampling__top_k=20)
    self.refused("config.data.agent_samples=2: expected 1 with the rloo estimator",
                 data__agent_samples=2, algo__advantage=dict(_advantage(), estimator="rloo"))
    self.refused("config.data.agent_samples=0: expected an integer >= 1", data__agent_samples=0)

  def test_agent_samples_need_an_agent_and_multiply_the_rows(self):
    cfg = config_lib.preset("grpo")
    cfg.data.env = "jaxrl_llm.envs.calculator:CalculatorEnv"
    cfg.data.agent_samples = 2
    with self.assertRaisesRegex(config_lib.ConfigError, "agent_samples=2: expected 1 without an "
                                "agent program"):
      config_lib.validate(cfg)
    cfg = _agent_preset()
    cfg.data.agent_samples = 3
    self.assertEqual(sources_lib.rows_per_prompt(cfg), 3 * cfg.sampling.num_samples)


def _agent_preset():
  cfg = config_lib.preset("grpo")
  cfg.data.agent = "jaxrl_llm.envs.calculator_agent:run"
  return cfg


def _advantage():
  return config_lib.preset("grpo").algo.advantage.to_dict()


class AgentCliTest(absltest.TestCase):

  @pytest.mark.slow("a real `python -m launch.train` of an agent program, two steps (forked "
                    "from tests/cli_runs.py's server): the process compiles a run's programs")
  def test_an_agent_file_trains_through_the_cli_and_its_rollouts_are_token_exact(self):
    root = tempfile.mkdtemp()
    model_dir = agent_testing.make_model_dir(os.path.join(root, "model"), eos_logit=2.0)
    agent_file = os.path.join(root, "my_agent.py")
    with open(agent_file, "w") as f:
      f.write(AGENT)
    workdir = os.path.join(root, "run")
    run = cli_runs.run(  # forked from the server that has imported JAX and the library
        "launch.train",
        ["--config=grpo:runlocal", f"--workdir={workdir}", f"--config.model.path={model_dir}",
         f"--config.data.agent={agent_file}:run", "--config.data.max_episode_tokens=96",
         "--config.sampling.max_new_tokens=16", "--config.data.env_workers=4",
         "--config.logging.rollouts_every=1", "--config.logging.trackers=jsonl"],
        cwd=REPO, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    with open(os.path.join(workdir, "rollouts.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    self.assertLen(rows, 2 * 2 * 4)  # 2 steps x 2 prompts x 4 episodes (runlocal)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      metrics = [json.loads(line) for line in f]
    self.assertEqual(sum(m["env/agent_calls"] for m in metrics),
                     sum(r["num_turns"] for r in rows))
    model = models.from_pretrained(model_dir)
    first = [r for r in rows if r["policy_version"] == 0]  # sampled by these weights
    self.assertNotEmpty(first)
    for r in first:
      self.assertEqual(r["reward_parts"]["env"], 0.5 * r["num_turns"])
      logp = log_softmax_of(model, r["tokens"])
      at = np.flatnonzero(np.asarray(r["loss_mask"][1:]) > 0)
      np.testing.assert_allclose(logp[at], np.asarray(r["behaviour_logprobs"][1:])[at],
                                 atol=1e-5)


if __name__ == "__main__":
  absltest.main()
