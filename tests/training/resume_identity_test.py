"""A checkpoint's record of its run, compared with a config's: fields the schema gained since
the checkpoint was written count as their defaults."""
from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm.training import resume


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


if __name__ == "__main__":
  absltest.main()
