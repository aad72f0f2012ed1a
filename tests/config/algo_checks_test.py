"""config.validate_algo, the algo section of the one validation: every check fails with a
message that says how to fix it."""
from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm import config
from jaxrl_llm.config import schema


def grpo_algo():
  return schema.algo_config(schema.sampling_config())


class ValidateAlgoTest(parameterized.TestCase):

  def test_default_is_valid(self):
    config.validate_algo(grpo_algo(), num_samples=8)

  @parameterized.named_parameters(
      ("estimator", "advantage.estimator", "grpoo",
       r"estimator = 'grpoo' is unknown; valid: \[.*'grpo'.*'rloo'.*'gae'"),
      ("aggregation", "loss.aggregation", "mean",
       r"aggregation = 'mean' is unknown; valid: \[.*'token_mean'.*'seq_mean_token_sum_norm'"),
      ("ratio", "loss.ratio", "seq", r"ratio = 'seq' is unknown"),
      ("trust_region", "loss.trust_region", "trpo", r"trust_region = 'trpo' is unknown"),
      ("clip_low_high", "loss.clip_low", 1.5, r"clip_low = 1.5 must be in \(0, 1\)"),
      ("clip_low_zero", "loss.clip_low", 0.0, r"clip_low = 0.0 must be in \(0, 1\)"),
      ("clip_high", "loss.clip_high", -0.1, r"clip_high = -0.1 must be > 0"),
      ("dual_clip", "loss.dual_clip", 0.5, r"dual_clip = 0.5 must be 0 \(off\) or > 1"),
      ("kl_estimator", "kl.estimator", "k4", r"kl.estimator = 'k4' is unknown"),
      ("kl_placement", "kl.placement", "both", r"placement = 'both' is unknown"),
      ("scale", "advantage.scale", "prompt", r"scale = 'prompt' is unknown"),
      ("gamma", "advantage.gamma", 1.5, r"gamma = 1.5 must be in \[0, 1\]"),
      ("old_logp", "old_logp", "cache", r"old_logp = 'cache' is unknown"),
      ("iterations", "num_iterations", 0, r"num_iterations = 0 must be >= 1"),
      ("behaviour_mask_level", "behaviour_mask.level", "seq",
       r"behaviour_mask.level = 'seq' is unknown; valid: \['off', 'token', 'sequence'\]"),
      ("max_async_level", "max_async_level", -1, r"max_async_level = -1 must be an int >= 0"),
  )
  def test_bad_field(self, field, value, pattern):
    cfg = grpo_algo()
    *parents, leaf = field.split(".")
    node = cfg
    for p in parents:
      node = node[p]
    node[leaf] = value
    with self.assertRaisesRegex(ValueError, pattern):
      config.validate_algo(cfg, num_samples=8)

  def test_behaviour_mask_range_and_old_logp(self):
    cfg = grpo_algo()
    cfg.behaviour_mask.level, cfg.behaviour_mask.low, cfg.behaviour_mask.high = "token", 1.2, 2.0
    with self.assertRaisesRegex(ValueError, r"low / high = 1.2 / 2.0: expected 0 < low <= 1"):
      config.validate_algo(cfg, num_samples=8)
    cfg.behaviour_mask.low, cfg.old_logp = 0.5, "sampler"
    with self.assertRaisesRegex(ValueError, r"algo.old_logp must be 'recompute' or 'auto'"):
      config.validate_algo(cfg, num_samples=8)
    cfg.old_logp = "auto"
    config.validate_algo(cfg, num_samples=8)

  def test_group_estimator_needs_two_samples(self):
    for estimator in ("grpo", "rloo", "dr_grpo", "max_rl", "reinforce_pp_baseline"):
      cfg = grpo_algo()
      cfg.advantage.estimator = estimator
      with self.assertRaisesRegex(ValueError, "needs G = sampling.num_samples >= 2, got 1"):
        config.validate_algo(cfg, num_samples=1)
    cfg.advantage.estimator = "reinforce_pp"  # not a group estimator
    config.validate_algo(cfg, num_samples=1)

  def test_norm_length_missing(self):
    cfg = grpo_algo()
    cfg.loss.aggregation = "seq_mean_token_sum_norm"
    with self.assertRaisesRegex(ValueError, "needs algo.loss.norm_length > 0"):
      config.validate_algo(cfg)
    cfg.loss.norm_length = 1024
    config.validate_algo(cfg)

  def test_combinations(self):
    cfg = grpo_algo()
    cfg.loss.ratio = "none"
    with self.assertRaisesRegex(ValueError, "trust_region must be 'none'"):
      config.validate_algo(cfg)
    cfg = grpo_algo()
    cfg.loss.trust_region, cfg.loss.ratio = "gmpo", "sequence"
    with self.assertRaisesRegex(ValueError, "ratio must be 'token'"):
      config.validate_algo(cfg)
    cfg = grpo_algo()
    cfg.advantage.estimator = "gae"
    with self.assertRaisesRegex(ValueError, "value.coef must be > 0"):
      config.validate_algo(cfg)
    cfg = grpo_algo()
    cfg.loss.trust_region, cfg.loss.clip_low = "cispo", 5.0  # >= 1: no lower bound; fine
    config.validate_algo(cfg)

  def test_user_functions_must_resolve(self):
    cfg = grpo_algo()
    cfg.advantage.fn = "no_such_module_xyz:fn"
    cfg.loss.reducer = "/no/such/file.py:fn"
    with self.assertRaises(ValueError) as ctx:
      config.validate_algo(cfg)
    self.assertIn("algo.advantage.fn = 'no_such_module_xyz:fn' does not resolve", str(ctx.exception))
    self.assertIn("algo.loss.reducer = '/no/such/file.py:fn' does not resolve", str(ctx.exception))

  def test_lists_every_problem(self):
    cfg = grpo_algo()
    cfg.advantage.estimator = "x"
    cfg.loss.clip_high = -1.0
    cfg.kl.coef = -1.0
    with self.assertRaises(ValueError) as ctx:
      config.validate_algo(cfg)
    message = str(ctx.exception)
    for part in ("estimator = 'x'", "clip_high = -1.0", "kl.coef = -1.0"):
      self.assertIn(part, message)


if __name__ == "__main__":
  absltest.main()
