"""Runs whose signal comes from elsewhere train without reward functions: an environment's
step rewards, or a teacher (the opd preset on a user's records, which carry no `answer`)."""
import json
import os

from absl.testing import absltest

from jaxrl_llm import config as config_lib
from jaxrl_llm import training
from tests.training import agent_testing, distillation_test


def metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


class RewardsOptionalTest(absltest.TestCase):

  def test_environment_step_rewards_alone(self):
    root = self.create_tempdir().full_path
    config = config_lib.preset("grpo:runlocal")
    config.model.path = agent_testing.make_model_dir(os.path.join(root, "model"))
    config.data.env = agent_testing.SCRIPTED_ENV + ":ScriptedEnv"
    config.data.env_args = {"reward_per_turn": 0.25}
    config.data.max_episode_tokens = 80
    config.rewards.functions, config.rewards.weights = (), ()
    workdir = os.path.join(root, "run")
    training.train(config, workdir)
    rows = metrics(workdir)
    self.assertEqual([r["step"] for r in rows], [1, 2])
    for row in rows:
      self.assertGreater(row["reward_mean"], 0.0)  # 0.25 per environment step
      self.assertEmpty([k for k in row if k.startswith("reward/arithmetic")])

  def test_opd_preset_on_records_without_an_answer(self):
    root = self.create_tempdir().full_path
    path = os.path.join(root, "data.jsonl")
    with open(path, "w") as f:
      f.writelines(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(8))
    config = distillation_test.opd_config("")
    config.data.source = f"jsonl:{path}"
    config.teacher.path = distillation_test.save_teacher(os.path.join(root, "teacher"), config,
                                                         num_layers=1)
    config_lib.validate(config, data=True)
    workdir = os.path.join(root, "run")
    last = training.train(config, workdir)
    self.assertGreater(last["distill/reverse_kl"], 0.0)
    self.assertEqual([r["reward_mean"] for r in metrics(workdir)], [0.0, 0.0])


if __name__ == "__main__":
  absltest.main()
