"""Episode-level admission (`rollouts.admitted`): an episode's next turn starts when its own
environment has answered. With an environment that answers some records slowly, the fast
episodes play all their turns while the slow ones wait (the turn-synchronous player makes
them wait too), and every episode is token-exact: its behaviour log-probs equal one forward
of the policy over the episode."""
import dataclasses
import os
import shutil
import tempfile

import jax
import numpy as np
from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm import data, models, sampling
from jaxrl_llm.config import sources as sources_lib
from jaxrl_llm.training.rollouts import admitted, episodes, players
from tests.training import agent_testing
from tests.training.agents_test import log_softmax_of
from tests.training.episodes_test import agent_config

SLOW = 1.5  # seconds each step of a slow record's environment takes
RECORDS = [{"prompt": "slow 1+2"}, {"prompt": "fast 3+4"}, {"prompt": "fast 5+6"}]


def player_of(model_dir: str, engine: str, **sampling_fields):
  cfg = agent_config(model_dir, replies=3, delays={"slow 1+2": SLOW})
  cfg.data.env = agent_testing.SCRIPTED_ENV + ":TimedEnv"
  cfg.data.env_workers = 8
  cfg.data.max_turns = 5
  cfg.sampling.engine = engine
  cfg.sampling.update(sampling_fields)
  config_lib.validate(cfg, data=True)
  tokenizer = data.load_tokenizer(model_dir)
  model = models.from_pretrained(model_dir)
  settings = sampling.settings.from_config(
      cfg.sampling, sampling.eos_ids(tokenizer, model.config), sampling.pad_id(tokenizer))
  source = sources_lib.run_sources(cfg)[0]
  return players.player_for(source, tokenizer, settings), episodes.local_model(model)


def events_of(player):
  """The environments' steps in the last play: (prompt, the model's turns so far, start,
  end), by start."""
  return sorted(((p, k, t0, t1) for env in player.envs for p, kind, k, t0, t1 in env.events
                 if kind == "step"), key=lambda e: e[2])


def play(player, model, seed: int):
  """Plays G = 2 episodes of each record (after a warm-up of the same shape, all fast, that
  compiles the programs)."""
  records = [r for r in RECORDS for _ in range(2)]
  player.play(model, [{"prompt": "fast 0+0"}] * len(records), [0] * len(records),
              jax.random.PRNGKey(99))
  for env in player.envs:
    env.events.clear()
  return player.play(model, records, list(range(len(records))),
                     jax.random.PRNGKey(seed))


class AdmissionTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.dir = tempfile.mkdtemp()
    # End-of-turn likely: most turns end by it, so episodes run several turns.
    cls.model_dir = agent_testing.make_model_dir(os.path.join(cls.dir, "model"), eos_logit=2.5)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.dir, ignore_errors=True)
    super().tearDownClass()

  def test_fast_episodes_finish_while_slow_ones_wait_and_each_is_token_exact(self):
    player, model = player_of(self.model_dir, "continuous")
    self.assertIsInstance(player, admitted.AdmittedEpisodePlayer)
    try:
      played = play(player, model, seed=0)
      events = events_of(player)
    finally:
      player.close()
    slow = [e for e in events if e[0].startswith("slow")]
    fast = [e for e in events if e[0].startswith("fast")]
    self.assertNotEmpty(slow, "the test needs the slow episodes to take a turn")
    # Fast episodes take later turns while the slow ones' first steps still sleep.
    first_slow_answer = min(e[3] for e in slow)
    later_turns_before = [e for e in fast if e[1] >= 2 and e[3] < first_slow_answer]
    self.assertNotEmpty(later_turns_before, events)
    # Out of order: every fast episode's environment was done before a slow one's was.
    self.assertLess(max(e[3] for e in fast), max(e[3] for e in slow))
    for ep in played:
      self.assertIsNotNone(ep.ended)
      mask = np.asarray(ep.loss_mask(), bool)
      logp = log_softmax_of(model, ep.tokens)
      np.testing.assert_allclose(logp[mask[1:]], np.asarray(ep.logprobs)[mask], atol=1e-5)

  def test_episodes_prefilled_in_pieces_are_token_exact(self):
    """`config.sampling.prefill_chunk`: the opening prompts and the environments' replies go
    into the player's engine in pieces of one 4-token page, and every episode's behaviour
    log-probs still equal one forward over it."""
    player, model = player_of(self.model_dir, "continuous", page_size=4, prefill_chunk=4)
    records = [{"prompt": p} for p in ("fast 3+4", "fast 5+6", "fast 12+34") for _ in range(2)]
    try:
      played = player.play(model, records, list(range(len(records))), jax.random.PRNGKey(1))
      pieces = player.engine.stats["pieces"]
    finally:
      player.close()
    self.assertGreater(pieces, len(records))  # prompts and replies of several pages
    self.assertGreater(max(ep.num_turns for ep in played), 1)
    for ep in played:
      mask = np.asarray(ep.loss_mask(), bool)
      logp = log_softmax_of(model, ep.tokens)
      np.testing.assert_allclose(logp[mask[1:]], np.asarray(ep.logprobs)[mask], atol=1e-5)

  def test_the_turn_synchronous_player_makes_fast_episodes_wait(self):
    # The contrast (what the first test would see without admission): no fast episode
    # takes its second step until the slow ones have answered their first.
    player, model = player_of(self.model_dir, "static")
    self.assertNotIsInstance(player, admitted.AdmittedEpisodePlayer)
    try:
      play(player, model, seed=0)
      events = events_of(player)
    finally:
      player.close()
    slow = [e for e in events if e[0].startswith("slow")]
    later_fast = [e for e in events if e[0].startswith("fast") and e[1] >= 2]
    self.assertNotEmpty(slow)
    self.assertNotEmpty(later_fast, "the test needs fast episodes of several turns")
    first_slow_answer = min(e[3] for e in slow)
    self.assertTrue(all(e[2] >= first_slow_answer for e in later_fast), events)

  def test_top_k_is_refused_naming_the_field(self):
    cfg = agent_config(self.model_dir)
    cfg.sampling.top_k = 5
    with self.assertRaisesRegex(config_lib.ConfigError, r"sampling.top_k.*5.*'static'"):
      config_lib.validate(cfg, data=True)
    cfg.sampling.engine = "static"  # the turn-synchronous player samples with top-k
    config_lib.validate(cfg, data=True)
    tokenizer = data.load_tokenizer(self.model_dir)
    settings = dataclasses.replace(sampling.settings.from_config(cfg.sampling, (0,), 0),
                                   engine="continuous")
    with self.assertRaisesRegex(ValueError, "sampling.top_k=5"):
      admitted.AdmittedEpisodePlayer(sources_lib.run_sources(cfg)[0], tokenizer, settings)

if __name__ == "__main__":
  absltest.main()
