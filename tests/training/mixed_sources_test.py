"""Mixed sources (`config.sources`): each row gets what a run of its source alone gives it,
one compiled program serves any mix, and a mixed run logs per source and resumes exactly."""
import os

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from configs import arithmetic
from jaxrl_llm import config as config_lib
from jaxrl_llm import models, objectives, training
from jaxrl_llm.config import ConfigError, source_config
from jaxrl_llm.training import plan as plan_lib
from jaxrl_llm.training import prepare, rollouts, steps
from jaxrl_llm.training import setup as setup_lib
from tests import cli_runs
from tests.training.run_logs import comparable, read_jsonl, resume_from_step_two

G, N = 4, 6


def one_source_config(estimator, **advantage):
  config = config_lib.preset("grpo")
  config.sampling.num_samples = G
  config.algo.kl.coef, config.algo.kl.placement = 0.0, "none"
  config.algo.old_logp = "sampler"
  config.algo.advantage.estimator = estimator
  for k, v in advantage.items():
    config.algo.advantage[k] = v
  return config


def mixed_config(estimators, **weights):
  config = one_source_config("grpo")
  with config.sources.unlocked():
    for name, estimator in estimators.items():
      config.sources[name] = source_config("task:arithmetic", weights.get(name, 1.0))
      config.sources[name].algo.advantage.estimator = estimator
  return config


def raw_batch(rng, sources_P):
  """A prepare-ready batch: P groups of G rows, each group one source's."""
  P = len(sources_P)
  B = P * G
  lengths = rng.integers(1, N + 1, size=B)
  mask = (np.arange(N)[None] < lengths[:, None]).astype(np.int32)
  return rollouts.TrainBatch(
      tokens=rng.integers(0, 50, size=(B, 3 + N)).astype(np.int32),
      attention_mask=np.concatenate([np.ones((B, 3), np.int32), mask], 1),
      loss_mask=mask, rewards=rng.choice([0.0, 0.1, 1.0, 1.1], size=B).astype(np.float32),
      sampler_logp=(-rng.random((B, N))).astype(np.float32),
      source_index=(None if sources_P is None
                    else np.repeat(np.asarray(sources_P, np.int32), G)))


def run_prepare(config, batch, baselines=None):
  plan = plan_lib.make_plan(config)
  fn = jax.jit(lambda b, bl: prepare.prepare_batch(
      b, None, None, None, None, bl, plan=plan, num_samples=G, temperature=1.0, chunk_size=4,
      num_micro=1))
  return fn, fn(jax.tree.map(jnp.asarray, batch), baselines)


class PerRowAlgorithmTest(absltest.TestCase):

  def test_each_row_gets_what_its_source_alone_gives(self):
    estimators = {"a": "grpo", "b": "rloo", "c": "reinforce_pp", "d": "max_rl"}
    rng = np.random.default_rng(0)
    sources_P = np.array([0, 1, 2, 3, 1, 0, 2, 3])
    batch = raw_batch(rng, sources_P)
    _, (mixed, _, _) = run_prepare(mixed_config(estimators), batch)
    self.assertEqual(mixed.pg_weight.tolist(), [1.0] * len(sources_P) * G)
    rows = np.repeat(sources_P, G)
    for i, estimator in enumerate(estimators.values()):
      own = rollouts.TrainBatch(**{k: v[rows == i] for k, v in batch.fields().items()
                                   if k != "source_index"})  # its rows alone
      _, (alone, _, _) = run_prepare(one_source_config(estimator), own)
      np.testing.assert_allclose(np.asarray(mixed.advantages)[rows == i],
                                 np.asarray(alone.advantages), rtol=1e-6, atol=1e-6,
                                 err_msg=estimator)

  def test_rae_keeps_one_baseline_per_source(self):
    config = mixed_config({"x": "rae", "y": "grpo"})
    plan = plan_lib.make_plan(config)
    self.assertEqual(plan.baselines, 2)
    rng = np.random.default_rng(1)
    sources_P = np.array([0, 1, 0, 1])
    batch = raw_batch(rng, sources_P)
    _, (out, _, after) = run_prepare(config, batch, jnp.array([0.5, -1.0]))
    rows = np.repeat(sources_P, G)
    rewards = batch.rewards
    # Source x's rows, in order, against x's EMA (decay 0.95) from 0.5.
    b, expected = 0.5, []
    for r in rewards[rows == 0]:
      expected.append(r - b)
      b = 0.95 * b + 0.05 * r
    np.testing.assert_allclose(np.asarray(out.advantages)[rows == 0][:, 0], expected,
                               rtol=1e-5)
    self.assertAlmostEqual(float(after[0]), b, places=5)

  def test_the_critic_learns_only_the_gae_rows(self):
    config = mixed_config({"p": "gae", "q": "grpo"})
    config.algo.value.coef = 0.5
    config_lib.validate(config)
    plan = plan_lib.make_plan(config)
    policy = models.init(setup_lib.model_config(config.model), jax.random.PRNGKey(0))
    value = models.value_model(policy)
    sources_P = np.array([0, 1, 1, 0])
    batch = jax.tree.map(jnp.asarray, raw_batch(np.random.default_rng(4), sources_P))
    out, _, _ = jax.jit(lambda b, v: prepare.prepare_batch(
        b, None, None, v, None, None, plan=plan, num_samples=G, temperature=1.0, chunk_size=4,
        num_micro=1))(batch, value)
    gae_rows = np.repeat(sources_P, G) == 0
    np.testing.assert_array_equal(np.asarray(out.value_mask),
                                  np.asarray(batch.loss_mask) * gae_rows[:, None])
    self.assertTrue(np.all(np.asarray(out.returns)[~gae_rows] == 0))
    self.assertTrue(np.any(np.asarray(out.returns)[gae_rows] != 0))

  def test_a_new_mix_does_not_recompile(self):
    config = mixed_config({"a": "grpo", "b": "rloo"})
    with config.sources.b.algo.unlocked():
      config.sources.b.algo.loss.pg_coef = 0.5
    rng = np.random.default_rng(2)
    fn, _ = run_prepare(config, raw_batch(rng, [0, 0, 0, 1]))
    for mix in ([0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 0, 1]):
      out, _, _ = fn(jax.tree.map(jnp.asarray, raw_batch(rng, mix)), None)
      self.assertEqual(np.asarray(out.pg_weight).tolist(),
                       [1.0 if s == 0 else 0.5 for s in np.repeat(mix, G)])
    self.assertEqual(fn._cache_size(), 1)  # pylint: disable=protected-access


class PerRowLossTest(absltest.TestCase):
  """Each term of a mixed batch is normalised over its own rows (prime-rl's
  L = Σ l_rl / N_rl + Σ l_ce / N_ce)."""

  def test_terms_sum_over_their_own_rows(self):
    config = config_lib.preset("grpo")
    algo = config.algo.copy_and_resolve_references()
    algo.kl.coef = 0.0
    rng = np.random.default_rng(3)
    logp = jnp.asarray(-rng.random((4, 5)), jnp.float32)
    old = logp + 0.05 * jnp.asarray(rng.standard_normal((4, 5)), jnp.float32)
    teacher = logp - 0.3
    adv = jnp.asarray(rng.standard_normal((4, 5)), jnp.float32)
    mask = jnp.asarray((np.arange(5)[None] < np.array([5, 2, 4, 3])[:, None]), jnp.float32)
    pg_w, distill_w = jnp.array([1.0, 0.5, 0.0, 0.0]), jnp.array([0.0, 0.0, 1.0, 2.0])
    weights = {"pg": pg_w, "distill": distill_w}
    loss, metrics = objectives.policy_loss(logp, old, adv, mask, algo, teacher_logp=teacher,
                                           row_weights=weights)
    # By hand: GRPO's clipped term, seq-mean-token-mean over rows 0 and 1 with their weights;
    # the opd term, token mean over the tokens of rows 2 and 3 with theirs.
    ratio = jnp.exp(logp - old)
    pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv)
    per_row = (pg * mask).sum(1) / mask.sum(1)
    expected_pg = (1.0 * per_row[0] + 0.5 * per_row[1]) / 2
    masked = (jnp.exp(logp) - jnp.exp(old)) < -0.2
    opd = (-jnp.where(masked, 0.0, (teacher - logp) * ratio)
           + 1e-3 * jnp.square(logp - old))
    expected_distill = ((opd[2] * mask[2]).sum() * 1.0 + (opd[3] * mask[3]).sum() * 2.0) / (
        mask[2].sum() + mask[3].sum())
    self.assertAlmostEqual(float(metrics["pg_loss"]), float(expected_pg), places=6)
    self.assertAlmostEqual(float(metrics["distill_loss"]), float(expected_distill), places=6)
    self.assertAlmostEqual(float(loss), float(expected_pg + expected_distill), places=6)
    # Micro-batches with the whole batch's counts add up to the same loss.
    counts = objectives.loss_counts(mask, weights)
    pieces = [objectives.policy_loss(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2],
                                     algo, teacher_logp=teacher[i:i + 2], counts=counts,
                                     row_weights={k: w[i:i + 2] for k, w in weights.items()})[0]
              for i in (0, 2)]
    self.assertAlmostEqual(float(sum(pieces)), float(loss), places=6)

  def test_policy_step_reads_the_row_weights(self):
    ones = np.ones((2, 3), np.int32)
    batch = rollouts.TrainBatch(tokens=ones, attention_mask=ones, loss_mask=ones,
                                pg_weight=np.array([1.0, 0.5]))
    self.assertEqual(list(steps._row_weights(batch)), ["pg"])  # pylint: disable=protected-access
    both = batch.replace(distill_weight=np.array([0.0, 2.0]))
    weights = steps._row_weights(both)  # pylint: disable=protected-access
    self.assertEqual(sorted(weights), ["distill", "pg"])
    self.assertIs(weights["distill"], both.distill_weight)
    self.assertEqual(steps._row_weights(batch.replace(pg_weight=None)), {})  # one source


class MixedConfigTest(absltest.TestCase):

  def test_run_level_per_row_fields_are_refused(self):
    config = arithmetic.get_config("preset=mixed,runlocal")
    config_lib.validate(config)
    config.algo.advantage.estimator = "rloo"
    with self.assertRaisesRegex(ConfigError, "config.algo.advantage.estimator='rloo' is set per "
                                "source.*config.sources.NAME.algo.advantage.estimator"):
      config_lib.validate(config)

  def test_bad_sources_are_named(self):
    config = arithmetic.get_config("preset=mixed,runlocal")
    config.sources.rl.weight = -1.0
    with self.assertRaisesRegex(ConfigError, r"config.sources.rl.weight=-1.0: expected a finite"):
      config_lib.validate(config)
    config = arithmetic.get_config("preset=mixed,runlocal")
    config.sources.rl.algo.advantage.estimator = "grop"
    with self.assertRaisesRegex(ConfigError, "sources.rl.algo.advantage.estimator = 'grop'"):
      config_lib.validate(config)
    config = arithmetic.get_config("preset=mixed,runlocal")
    config.sources.rl.algo.advantage.scale = "batch"
    with self.assertRaisesRegex(ConfigError, "normalises over the whole batch"):
      config_lib.validate(config)
    config = arithmetic.get_config("preset=mixed,runlocal")
    config.teacher.path = ""
    with self.assertRaisesRegex(ConfigError, "sources.distill.algo.distill.coef = 1.0 distil"):
      config_lib.validate(config)
    self.assertIn("is not a known key", config_lib.unknown_key("sources.rl.wieght"))
    self.assertIsNone(config_lib.unknown_key("sources.rl.task_options.seed"))


def mixed_run_config():
  config = arithmetic.get_config("preset=mixed,runlocal")
  config.train.steps = 4
  config.checkpoint.every = 2
  config.sources.rl.weight, config.sources.distill.weight = 0.75, 0.25  # 3 : 1 of 4 prompts
  return config


class MixedRunTest(absltest.TestCase):

  def test_logs_per_source_and_resumes_exactly(self):
    first, second = self.create_tempdir().full_path, self.create_tempdir().full_path
    training.train(mixed_run_config(), first)
    rows = [comparable(r) for r in read_jsonl(first)]
    self.assertLen(rows, 4)
    for row in rows:
      self.assertEqual((row["rows/rl"], row["rows/distill"]), (24.0, 8.0))
      for key in ("reward_mean/rl", "reward_mean/distill", "response_length_mean/distill",
                  "reward/rl/arithmetic_exact", "distill/reverse_kl", "distill_loss"):
        self.assertIn(key, row)
    resumed = resume_from_step_two(mixed_run_config(), first, second)
    self.assertEqual([comparable(r) for r in resumed], [comparable(r) for r in rows])

  def test_the_cli_runs_the_mixed_preset(self):
    workdir = self.create_tempdir().full_path
    result = cli_runs.run(
        "launch.train", ["--config=configs/arithmetic.py:preset=mixed,runlocal",
                         "--config.sources.rl.weight=0.25", "--config.train.eval_every=2",
                         f"--workdir={workdir}"], env=dict(os.environ, JAX_PLATFORMS="cpu"))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn("plan: sources: distill (0.5: distill 1), rl (0.25: grpo)",  # in name order
                  result.stdout + result.stderr)
    last = read_jsonl(workdir)[-1]
    self.assertEqual((last["rows/rl"], last["rows/distill"]), (8.0, 24.0))  # 1/3 : 2/3 of 4
    for source in ("rl", "distill"):
      self.assertIn(f"eval/{source}/reward/arithmetic_exact", last)


if __name__ == "__main__":
  absltest.main()
