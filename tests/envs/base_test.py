"""The environment protocol: results checked with messages that say where, loading by path."""
import os
import subprocess
import sys
import textwrap

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm import envs

WHERE = "environment 'calc' (my_env.py:CalcEnv), record 17, turn 2"
TOOL = [{"role": "tool", "content": "408"}]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StepResultTest(parameterized.TestCase):

  def test_plain_tuple_accepted(self):
    result = envs.as_step_result((TOOL, 1, False), WHERE)
    self.assertEqual(result, envs.StepResult(TOOL, 1.0, False, {}))
    self.assertIsInstance(result.reward, float)

  def test_step_result_accepted_and_copied(self):
    given = envs.StepResult(TOOL, 0.5, False, {"k": 1})
    result = envs.as_step_result(given, WHERE)
    self.assertEqual(result, given)
    result.messages[0]["content"] = "changed"
    self.assertEqual(given.messages[0]["content"], "408")  # the user's dicts are not shared

  def test_done_without_messages_and_numpy_values(self):
    import numpy as np  # pylint: disable=g-import-not-at-top
    result = envs.as_step_result(([], np.float32(2.0), np.bool_(True)), WHERE)
    self.assertEqual((result.messages, result.reward, result.done), ([], 2.0, True))

  @parameterized.named_parameters(
      ("list_not_tuple", [TOOL, 0.0, False], "expected a StepResult or a tuple"),
      ("two_items", (TOOL, 0.0), "a tuple of 2 items"),
      ("messages_not_list", ("408", 0.0, False), "expected a list of messages"),
      ("message_not_dict", (["408"], 0.0, False), "message 0 = '408' of type str"),
      ("no_content", ([{"role": "tool"}], 0.0, False), "message 0 with no 'content'"),
      ("role_not_str", ([{"role": 1, "content": "x"}], 0.0, False), "'role' = 1 (int)"),
      ("assistant_role", ([{"role": "assistant", "content": "x"}], 0.0, False),
       "role 'assistant'"),
      ("reward_nan", (TOOL, float("nan"), False), "reward = nan (float); expected a finite"),
      ("reward_str", (TOOL, "1", False), "reward = '1' (str)"),
      ("reward_none", (TOOL, None, False), "reward = None"),
      ("done_str", (TOOL, 0.0, "yes"), "done = 'yes' (str); expected a bool"),
      ("done_2", (TOOL, 0.0, 2), "done = 2 (int)"),
      ("stuck", ([], 0.0, False), "no new messages and done = False"),
  )
  def test_malformed_refused_naming_where(self, value, expected):
    with self.assertRaises(envs.EnvError) as e:
      envs.as_step_result(value, WHERE)
    self.assertStartsWith(str(e.exception), WHERE + ": step() returned")
    self.assertIn(expected, str(e.exception))

  def test_bad_info_refused(self):
    with self.assertRaisesRegex(envs.EnvError, "info = 'x'; expected a dict"):
      envs.as_step_result(envs.StepResult(TOOL, info="x"), WHERE)

  def test_reset_messages_checked(self):
    self.assertEqual(envs.as_messages([{"role": "user", "content": "q", "name": "x"}], WHERE),
                     [{"role": "user", "content": "q", "name": "x"}])
    with self.assertRaises(envs.EnvError) as e:
      envs.as_messages([], WHERE)
    self.assertStartsWith(str(e.exception), f"{WHERE}: reset() returned no messages")
    with self.assertRaisesRegex(envs.EnvError, "reset\\(\\) returned str 'q'"):
      envs.as_messages("q", WHERE)


class Raising(envs.Environment):

  def reset(self, record):
    raise KeyError("prompt")


class CallEnvTest(absltest.TestCase):

  def test_wraps_with_where_and_cause(self):
    with self.assertRaises(envs.EnvError) as e:
      envs.call_env(Raising(), "reset", {}, where=WHERE)
    self.assertEqual(str(e.exception), f"{WHERE}: reset() raised KeyError: 'prompt'")
    self.assertIsInstance(e.exception.__cause__, KeyError)

  def test_base_class_methods_are_abstract(self):
    with self.assertRaisesRegex(envs.EnvError, "step\\(\\) raised NotImplementedError"):
      envs.call_env(envs.Environment(), "step", [], where=WHERE)

  def test_returns_value(self):
    class Env(envs.Environment):
      def reset(self, record):
        return [{"role": "user", "content": record["prompt"]}]
    self.assertEqual(envs.call_env(Env(), "reset", {"prompt": "q"}, where=WHERE),
                     [{"role": "user", "content": "q"}])


ENV_FILE = textwrap.dedent("""\
    from jaxrl_llm import envs

    class EchoEnv(envs.Environment):
      def __init__(self, suffix="!", **env_args):
        super().__init__(**env_args)
        self.suffix = suffix

      def reset(self, record):
        return [{"role": "user", "content": record["prompt"] + self.suffix}]

      def step(self, messages):
        return [], 1.0, True

    class Strict(envs.Environment):
      def __init__(self, suffix="!"):
        super().__init__(suffix=suffix)

    class NoStep:
      def reset(self, record):
        return []

    NOT_CALLABLE = 3
    """)


class LoadEnvironmentTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = self.create_tempfile("my_env.py", ENV_FILE).full_path

  def test_loads_by_path_and_records_spec_and_args(self):
    env = envs.load_environment(f"{self.path}:EchoEnv", {"suffix": "?"})
    self.assertEqual(env.reset({"prompt": "q"}), [{"role": "user", "content": "q?"}])
    self.assertEqual(env.spec, f"{self.path}:EchoEnv")
    self.assertEqual(env.env_args, {"suffix": "?"})

  def test_relative_path_recorded_absolute(self):
    cwd = os.getcwd()
    os.chdir(os.path.dirname(self.path))
    try:
      env = envs.load_environment("./my_env.py:EchoEnv", None)
    finally:
      os.chdir(cwd)
    self.assertEqual(env.spec, f"{self.path}:EchoEnv")

  def test_loads_by_module(self):
    env = envs.load_environment("tests.envs.envs_testdata:CalcEnv", {"tool_timeout_s": 3})
    self.assertEqual(env.tool_timeout_s, 3.0)
    self.assertEqual(env.spec, "tests.envs.envs_testdata:CalcEnv")

  def test_errors_name_the_spec(self):
    for spec, expected in [
        (f"{self.path}:Missing", "has no attribute 'Missing'"),
        (f"{self.path}:NOT_CALLABLE", "not a function"),
        (f"{self.path}:NoStep", "built a NoStep, which has no step() method"),
        ("/no/such/env.py:Env", "does not exist"),
        ("no_colon", "must look like"),
    ]:
      with self.assertRaises(envs.EnvError) as e:
        envs.load_environment(spec, None)
      self.assertIn(repr(spec), str(e.exception))
      self.assertIn(expected, str(e.exception))
    with self.assertRaisesRegex(envs.EnvError, "building it with env_args {'bad': 1} raised "
                                "TypeError"):
      envs.load_environment(f"{self.path}:Strict", {"bad": 1})


class NoJaxTest(absltest.TestCase):

  def test_import_does_not_import_jax_or_transformers(self):
    code = ("import sys, jaxrl_llm.envs; "
            "print(sorted(m for m in ('jax', 'flax', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=60)
    self.assertEqual(out.stdout.strip(), "[]")


if __name__ == "__main__":
  absltest.main()
