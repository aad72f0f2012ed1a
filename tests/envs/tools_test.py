"""Tool environments: parsing, schemas, every failure answered and counted, real timeouts."""
import json
import os
import textwrap
import threading
import time

from absl.testing import absltest
from absl.testing import parameterized

from jaxrl_llm import envs
from tests.envs import envs_testdata as td


def assistant(text):
  return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


class ParseTest(parameterized.TestCase):

  def test_single(self):
    calls = envs.parse_tool_calls(
        'Let me compute. <tool_call>\n{"name": "calc", "arguments": {"expression": "12*34"}}\n'
        "</tool_call>")
    body = '{"name": "calc", "arguments": {"expression": "12*34"}}'
    self.assertEqual(calls, [envs.ToolCall("calc", {"expression": "12*34"}, body)])

  def test_several_in_order_whitespace_tolerant(self):
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>text between'
            '<tool_call> \n\t {"name":"b","arguments":{"x":1}} \n </tool_call>\n'
            '<tool_call>\n\n{\n  "name": "c",\n  "arguments": {"y": [1, 2]}\n}\n\n</tool_call>')
    calls = envs.parse_tool_calls(text)
    self.assertEqual([(c.name, c.arguments) for c in calls],
                     [("a", {}), ("b", {"x": 1}), ("c", {"y": [1, 2]})])

  def test_no_calls(self):
    self.assertEqual(envs.parse_tool_calls("The answer is 408. </tool_call>"), [])

  @parameterized.named_parameters(
      ("bad_json", '{"name": "calc", "arguments": {"expression": 12*34}}', "not valid JSON"),
      ("truncated_json", '{"name": "calc", "arguments": {', "not valid JSON"),
      ("not_a_dict", '["calc", {"expression": "1"}]', "is a JSON list; expected an object"),
      ("missing_name", '{"arguments": {"expression": "1"}}', 'has no "name" string'),
      ("name_not_str", '{"name": 3, "arguments": {}}', '"name" is not a string'),
      ("missing_arguments", '{"name": "calc"}', 'has no "arguments" object'),
      ("arguments_not_dict", '{"name": "calc", "arguments": "1+1"}',
       '"arguments" is not an object'),
  )
  def test_malformed(self, body, expected):
    calls = envs.parse_tool_calls(f"ok <tool_call>{body}</tool_call> then "
                                  '<tool_call>{"name": "calc", "arguments": {}}</tool_call>')
    self.assertLen(calls, 2)
    self.assertIsInstance(calls[0], envs.ToolCallError)
    self.assertEqual(calls[0].kind, "bad_json")
    self.assertIn(expected, calls[0].message)
    self.assertStartsWith(calls[0].message, "error: ")
    self.assertEqual(calls[1], envs.ToolCall("calc", {}, '{"name": "calc", "arguments": {}}'))

  def test_unclosed_call(self):
    calls = envs.parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call> '
                                  '<tool_call>{"name": "calc", "argu')
    self.assertEqual(calls[0].name, "a")
    self.assertEqual(calls[1].kind, "bad_json")
    self.assertIn("not closed", calls[1].message)


def no_args_doc(x: int) -> int:
  """Doubles x."""
  return 2 * x


def no_hint(x) -> int:
  """Doubles x.

  Args:
    x: a number.
  """
  return 2 * x


class SchemaTest(absltest.TestCase):

  def test_schema_from_docstring_and_hints(self):
    self.assertEqual(td.CalcEnv().tool_schemas(), [{
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluates an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {
                    "type": "string",
                    "description": 'digits, + - * and parentheses, e.g. "12*34".'}},
                "required": ["expression"]},
            "return": {"type": "string"}}}])

  def test_docstring_errors_name_the_tool(self):
    for fn, expected in [(no_args_doc, "no description for the argument 'x'"),
                         (no_hint, "missing a type hint")]:
      env = envs.ToolEnv()
      env.tools = [td.calc, fn]
      with self.assertRaises(envs.EnvError) as e:
        env.tool_schemas()
      self.assertIn(f"tool {fn.__name__!r} has no JSON schema", str(e.exception))
      self.assertIn(expected, str(e.exception))

  def test_duplicate_and_unnamed_tools_refused(self):
    env = envs.ToolEnv()
    env.tools = [td.calc, td.calc]
    with self.assertRaisesRegex(envs.EnvError, "two tools are named 'calc'"):
      env.tool_schemas()
    env.tools = [lambda x: x]
    with self.assertRaisesRegex(envs.EnvError, "is not a named function"):
      env.tool_schemas()


def boom(message: str) -> str:
  """Raises.

  Args:
    message: the error's message.
  """
  raise RuntimeError(message)


class CategoriesTest(absltest.TestCase):
  """A directly built ToolEnv (no spec) runs tools in-process, on a thread."""

  def test_every_category_answered_in_order_and_counted(self):
    env = td.CalcEnv()
    env.tools = [td.calc, boom]
    turn = " ".join([
        td.call("calc", expression="12*34"),
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "calc"}</tool_call>',
        td.call("sqrt", x=2),
        td.call("calc", expression="1", expr="1"),
        td.call("calc"),
        td.call("calc", expression="1/0"),
        td.call("boom", message="no luck"),
        td.call("calc", expression="2+2"),
    ])
    result = envs.as_step_result(env.step(assistant(turn)), "test")
    self.assertFalse(result.done)
    self.assertEqual(result.reward, 0.0)
    self.assertEqual([m["role"] for m in result.messages], ["tool"] * 9)
    texts = [m["content"] for m in result.messages]
    self.assertEqual(texts[0], "408")
    self.assertStartsWith(texts[1], "error: the tool call is not valid JSON")
    self.assertStartsWith(texts[2], 'error: the tool call has no "arguments" object')
    self.assertEqual(texts[3], "error: unknown tool 'sqrt'; the tools are calc, boom")
    self.assertEqual(texts[4], "error: bad arguments for tool 'calc': got an unexpected "
                     "keyword argument 'expr'")
    self.assertEqual(texts[5], "error: bad arguments for tool 'calc': missing a required "
                     "argument: 'expression'")
    self.assertEqual(texts[6], "error: ValueError: bad character in '1/0'")
    self.assertEqual(texts[7], "error: RuntimeError: no luck")
    self.assertEqual(texts[8], "4")
    self.assertEqual(env.tool_stats.take(), {
        "calls": 9, "ok": 2, "bad_json": 2, "unknown_tool": 1, "bad_arguments": 2,
        "raised": 2, "timeout": 0})
    self.assertEqual(env.tool_stats.as_dict()["calls"], 0)  # take() reset them

  def test_turn_without_calls_ends_the_episode(self):
    env = td.CalcEnv()
    self.assertEqual(env.step(assistant("It is 408.")), envs.StepResult([], 0.0, True))
    self.assertEqual(env.tool_stats.calls, 0)

  def test_non_str_results_as_json(self):
    def stats(n: int) -> dict:
      """Stats.

      Args:
        n: a count.
      """
      return {"n": n, "ok": True}
    env = envs.ToolEnv()
    env.tools = [stats]
    self.assertEqual(env.step(assistant(td.call("stats", n=3))).messages[0]["content"],
                     '{"n": 3, "ok": true}')

  def test_default_reset_and_turn_outcome_hook(self):
    self.assertEqual(td.CalcEnv().reset({"prompt": "What is 2+2?"}), [
        {"role": "system", "content": "You are a calculator agent."},
        {"role": "user", "content": "What is 2+2?"}])

    class Stop(td.CalcEnv):
      def turn_outcome(self, messages, calls):
        return "FINAL" in messages[-1]["content"], 0.5
    result = Stop().step(assistant("FINAL " + td.call("calc", expression="1")))
    self.assertEqual(result, envs.StepResult([], 0.5, True))  # done: the call is not run
    with self.assertRaisesRegex(envs.EnvError, "needs a str 'prompt' field"):
      td.CalcEnv().reset({"question": "q"})

  def test_thread_timeout_reported_not_stopped(self):
    release = threading.Event()

    def wait(seconds: float) -> str:
      """Waits.

      Args:
        seconds: at most this long.
      """
      release.wait(seconds)
      return "done"
    env = envs.ToolEnv(tool_timeout_s=0.2)
    env.tools = [wait]
    start = time.monotonic()
    text = env.step(assistant(td.call("wait", seconds=60))).messages[0]["content"]
    self.assertLess(time.monotonic() - start, 2)
    release.set()
    self.assertEqual(text, "error: tool 'wait' did not finish within 0.2 s")
    self.assertEqual(env.tool_stats.timeout, 1)


WORKER_ENV = textwrap.dedent('''\
    import os, sys, time
    from jaxrl_llm import envs

    def calc(expression: str) -> str:
      """Evaluates an arithmetic expression.

      Args:
        expression: e.g. "12*34".
      """
      return str(eval(expression))

    def hang(seconds: float) -> str:
      """Sleeps.

      Args:
        seconds: how long.
      """
      time.sleep(seconds)
      return "woke up"

    def whoami() -> dict:
      """The worker's pid and what it imported."""
      return {"pid": os.getpid(), "heavy": sorted(m for m in ("jax", "flax", "transformers")
                                                  if m in sys.modules)}

    def crash(code: int) -> str:
      """Ends the process at once.

      Args:
        code: its exit code.
      """
      os._exit(code)

    class WorkerEnv(envs.ToolEnv):
      tools = [calc, hang, whoami, crash]
    ''')


class WorkerTest(absltest.TestCase):
  """An environment loaded from a .py file runs its tools in a killable worker process."""

  def setUp(self):
    super().setUp()
    path = self.create_tempfile("worker_env.py", WORKER_ENV).full_path
    self.env = envs.load_environment(f"{path}:WorkerEnv", {"tool_timeout_s": 1})
    self.addCleanup(self.env.close)

  def run_tool(self, name, **arguments):
    result = envs.as_step_result(self.env.step(assistant(td.call(name, **arguments))), "test")
    return result.messages[0]["content"]

  def test_runs_in_a_light_worker_process(self):
    info = json.loads(self.run_tool("whoami"))
    self.assertNotEqual(info["pid"], os.getpid())
    self.assertEqual(info["heavy"], [])  # the parent (pytest's conftest) did import jax
    self.assertEqual(self.run_tool("calc", expression="12*34"), "408")
    self.assertEqual(json.loads(self.run_tool("whoami"))["pid"], info["pid"])  # persistent
    self.assertEqual(self.env._runner.starts, 1)

  def test_hanging_tool_is_stopped_and_the_worker_restarted(self):
    self.assertEqual(self.run_tool("calc", expression="1+1"), "2")  # the worker is up
    old_pid = self.env._runner.pid
    start = time.monotonic()
    text = self.run_tool("hang", seconds=60)
    elapsed = time.monotonic() - start
    self.assertEqual(text, "error: tool 'hang' did not finish within 1 s and was stopped")
    self.assertBetween(elapsed, 1.0, 2.5)
    with self.assertRaises(ProcessLookupError):  # killed and reaped, not abandoned
      os.kill(old_pid, 0)
    self.assertEqual(self.run_tool("calc", expression="12*34"), "408")
    self.assertNotEqual(self.env._runner.pid, old_pid)
    self.assertEqual(self.env._runner.starts, 2)
    self.assertEqual(self.env.tool_stats.take(), {
        "calls": 3, "ok": 2, "bad_json": 0, "unknown_tool": 0, "bad_arguments": 0,
        "raised": 0, "timeout": 1})

  def test_tool_ending_the_process_is_raised_then_restarted(self):
    self.assertEqual(self.run_tool("crash", code=3),
                     "error: the tool process died while running 'crash' (exit code 3)")
    self.assertEqual(self.env.tool_stats.raised, 1)
    self.assertEqual(self.run_tool("calc", expression="2*3"), "6")

  def test_close_stops_the_worker(self):
    with self.env:
      self.run_tool("calc", expression="1")
      pid = self.env._runner.pid
    with self.assertRaises(ProcessLookupError):
      os.kill(pid, 0)
    self.assertEqual(self.run_tool("calc", expression="5"), "5")  # a new one on demand

  def test_the_worker_exits_by_itself_when_the_pipe_closes(self):
    """A parent that goes away (its end of the pipe closed) leaves no worker behind: the
    worker returns on its own, exit code 0, without being killed."""
    self.run_tool("calc", expression="1")
    state = self.env._runner._state
    state["conn"].close()
    state["proc"].join(30)
    self.assertEqual(state["proc"].exitcode, 0)


if __name__ == "__main__":
  absltest.main()
