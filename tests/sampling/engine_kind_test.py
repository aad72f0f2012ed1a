"""`sampling.engine_kind`: the one decision of which engine runs a workload, by setting and
platform (validation asks it too: tests/training/partial_episodes_test.py)."""
from absl.testing import absltest, parameterized

from jaxrl_llm import sampling

# workload -> the engine for sampling.engine 'static', 'continuous', 'auto' on a CPU (and a
# GPU: the same row), 'auto' on a TPU; None: refused. 'samples' at 64 and 1024 new tokens.
TABLE = {
    "samples": ("static", "continuous", "static", "static"),
    "samples_long": ("static", "continuous", "continuous", "static"),
    "episodes": ("turns", "slots", "slots", "turns"),
    "partial_samples": ("slots", "slots", "slots", "slots"),
    "partial_episodes": (None, "slots", "slots", None),
    "agents": ("slots", "slots", "slots", "slots"),
    "serve": ("slots", "slots", "slots", "slots"),
}
COLUMNS = (("static", "cpu"), ("continuous", "cpu"), ("auto", "cpu"), ("auto", "tpu"))


class EngineKindTest(parameterized.TestCase):

  def test_the_table(self):
    self.assertEqual(set(sampling.WORKLOADS), set(TABLE) - {"samples_long"})
    for row, kinds in TABLE.items():
      workload, new_tokens = row.removesuffix("_long"), 1024 if row.endswith("_long") else 64
      for (engine, where), want in zip(COLUMNS, kinds):
        settings = sampling.SamplingSettings(2, new_tokens, engine=engine)
        for platform in ("cpu", "gpu") if where == "cpu" else (where,):
          what = f"{row} with engine={engine!r} on {platform}"
          if want is None:
            with self.assertRaisesRegex(ValueError, rf"sampling.engine={engine!r} on {platform} "
                                        r"plays episodes turn by turn.*expected "
                                        r"sampling.engine='continuous'", msg=what):
              sampling.engine_kind(settings, workload, platform)
          else:
            self.assertEqual(sampling.engine_kind(settings, workload, platform), want, what)

  def test_auto_takes_the_continuous_engine_from_256_new_tokens_on_a_cpu(self):
    for new_tokens, want in ((255, "static"), (256, "continuous")):
      settings = sampling.SamplingSettings(2, new_tokens)
      self.assertEqual(sampling.engine_kind(settings, "samples"), want)

  def test_an_unknown_workload(self):
    with self.assertRaisesRegex(ValueError, r"workload='decode': expected one of \['samples'"):
      sampling.engine_kind(sampling.SamplingSettings(2, 16), "decode")


if __name__ == "__main__":
  absltest.main()
