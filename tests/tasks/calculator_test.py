"""task:calculator: problems, the sloppy teacher's conversations (what CalculatorEnv
answers), the valid-call reward, and a demonstration laid out for SFT (token-exact, the
loss on the model's turns only)."""
import collections

import numpy as np
from absl.testing import absltest

from jaxrl_llm import assets, data, envs, tasks
from jaxrl_llm import config as config_lib
from jaxrl_llm.envs import calculator as calculator_env
from jaxrl_llm.rewards import calculator as calculator_rewards
from jaxrl_llm.tasks import calculator
from jaxrl_llm.training.rollouts import episodes, multi_turn

TEACHER = dict(teacher_skip_tool=0.15, teacher_wrong_name=0.6)


class CalculatorTaskTest(absltest.TestCase):

  def test_problems_and_splits(self):
    train = tasks.load_split("calculator", "train")
    held_out = tasks.load_split("calculator", "eval", num_eval=64)
    self.assertLen(held_out, 64)
    for r in list(held_out) + [train[i] for i in range(100)]:
      a, b = map(int, r["prompt"].split("*"))
      self.assertTrue(10 <= a <= 99 and 10 <= b <= 99)
      self.assertEqual(r["answer"], a * b)
    self.assertFalse({r["prompt"] for r in held_out} & {train[i]["prompt"] for i in range(500)})
    with self.assertRaisesRegex(ValueError, "teacher_wrong_name"):
      tasks.load_split("calculator", "train", teacher_wrong_name=1.5)

  def test_the_teachers_conversations_are_what_the_environment_answers(self):
    demos = tasks.demonstrations("calculator", "train", **TEACHER)
    kinds = collections.Counter()
    env = calculator_env.CalculatorEnv()
    for i in range(600):
      record = demos[i]
      turns = record["completion"]
      self.assertEqual(turns[-1], {"role": "assistant", "content": str(record["answer"])})
      if len(turns) == 1:
        kinds["unaided"] += 1
        continue
      self.assertEqual(turns[0]["content"], calculator.tool_call(
          "calculator" if "calculator" in turns[0]["content"] else "calc", record["prompt"]))
      reply = env.step(env.reset(record) + turns[:1]).messages
      self.assertEqual(turns[1:2], reply)
      kinds["wrong_name" if reply[0]["content"].startswith("error:") else "calc"] += 1
    self.assertAlmostEqual(kinds["unaided"] / 600, 0.15, delta=0.04)
    self.assertAlmostEqual(kinds["wrong_name"] / (600 - kinds["unaided"]), 0.6, delta=0.05)

  def test_valid_call_reward(self):
    ok = [{"role": "user", "content": "2*3"}, {"role": "assistant", "content": "x"},
          {"role": "tool", "content": "6"}, {"role": "assistant", "content": "6"}]
    bad = ok[:2] + [{"role": "tool", "content": "error: unknown tool 'c'"}] + ok[3:]
    self.assertEqual(calculator_rewards.calculator_valid_call(
        [""] * 3, [""] * 3, messages=[ok, bad, ok[:2]]), [1.0, 0.0, 0.0])

  def test_exact_reward_is_the_tasks_accuracy(self):
    self.assertEqual(calculator_rewards.calculator_exact(
        ["47*83"] * 4, ["3901", "3901.0", "= 3901", "3901\nmore"], [3901] * 4),
                     [1.0, 0.0, 0.0, 1.0])
    # Its own name in the metrics (reward/calculator_exact, the demo's headline).
    self.assertEqual(config_lib.preset("grpo_calculator").rewards.functions,
                     ("jaxrl_llm.rewards.calculator:calculator_exact",
                      "jaxrl_llm.rewards.calculator:calculator_valid_call"))

  def test_a_demonstration_is_token_exact_with_the_loss_on_the_models_turns(self):
    tokenizer = data.load_tokenizer(assets.path("char_tools_tokenizer"))
    env = calculator_env.CalculatorEnv()
    renderer = envs.renderer_for(tokenizer, env)
    record = tasks.demonstrations("calculator", "train", teacher_skip_tool=0.0,
                                  teacher_wrong_name=1.0)[0]
    ep = multi_turn.demonstrated_episode(env, renderer, record, record["completion"], "test")
    conversation = env.reset(record) + record["completion"]
    whole = renderer.render(conversation, add_generation_prompt=False)
    self.assertEqual(ep.tokens, renderer.encode(whole)[:len(ep.tokens)])
    self.assertEqual(tokenizer.decode(ep.tokens), whole.rstrip())
    text = lambda role: "".join(tokenizer.decode([t]) for t, r in zip(ep.tokens, ep.roles)
                                if r == role)
    self.assertEqual(text("assistant"), "".join(m["content"] + "<eos>" for m in
                                                record["completion"] if m["role"] == "assistant"))
    self.assertIn("error: unknown tool 'calculator'", text("tool"))
    arrays = episodes.episode_arrays([ep], 1, 192, (40,), 0, {})
    self.assertEqual(int(arrays.mask.sum()), ep.loss_mask().count(1))
    self.assertEqual(int(arrays.attention.sum()), len(ep.tokens) - ep.parts[0][2])
    np.testing.assert_array_equal(arrays.prompt_tokens[0, -ep.parts[0][2]:],
                                  ep.tokens[:ep.parts[0][2]])


if __name__ == "__main__":
  absltest.main()
