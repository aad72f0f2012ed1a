"""A checkpoint's record of its run, compared with a config's: fields the schema gained since
the checkpoint was written count as their defaults."""
from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm.training import resume, setup


class RunIdentityTest(absltest.TestCase):

  def test_a_field_added_later_reads_as_its_default(self):
    config = config_lib.preset("grpo")
    saved = resume.run_identity(config)
    del saved["algo"]["distill"]  # a checkpoint from before algo.distill existed
    del saved["algo"]["loss"]["pg_coef"]
    defaults = resume.run_identity(config_lib.base_config())
    self.assertEqual(resume.differences(resume.with_defaults(saved, defaults),
                                        resume.run_identity(config)), [])
    config.algo.distill.shaping_coef = 0.5  # but a real change still shows
    self.assertEqual(resume.differences(resume.with_defaults(saved, defaults),
                                        resume.run_identity(config)),
                     ["algo.distill.shaping_coef: 0.0 in the checkpoint, 0.5 in this config"])

  def test_speed_settings_change_neither_record(self):
    config = config_lib.preset("grpo")
    shapes = resume.fingerprint(setup.policy_config(config), value_model=False)
    identity = resume.run_identity(config)
    config.model.moe_impl, config.model.remat, config.model.attention = "ragged", "none", "xla"
    self.assertEqual(resume.fingerprint(setup.policy_config(config), value_model=False), shapes)
    self.assertEqual(resume.run_identity(config), identity)
    # A checkpoint written before moe_impl was left out of the fingerprint still matches.
    earlier = {**shapes, "model": {**shapes["model"], "moe_impl": "auto"}}
    self.assertEqual(resume._without_speed_fields(earlier), shapes)  # pylint: disable=protected-access


if __name__ == "__main__":
  absltest.main()
