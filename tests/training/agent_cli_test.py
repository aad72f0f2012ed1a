"""A user's environment, in a file named by its path, runs through the CLI: episodes are
played, trained on and written to rollouts.jsonl (one step: every property shows in it); a
template that cannot render episodes token-exactly exits 2 with one line before anything is
written."""
import json
import os
import tempfile
import textwrap

import pytest
from absl.testing import absltest

from jaxrl_llm import data, envs
from tests import cli_runs
from tests.training import agent_testing

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_ENV = textwrap.dedent('''
    import time
    from jaxrl_llm import envs

    def add(a: int, b: int) -> str:
      """Adds.

      Args:
        a: a number.
        b: another.
      """
      return str(a + b)

    def wait(seconds: float) -> str:
      """Sleeps.

      Args:
        seconds: how long.
      """
      time.sleep(seconds)
      return "woke"

    class UserEnv(envs.ToolEnv):
      tools = [add, wait]

      def turn_outcome(self, messages, calls):  # two model turns, whatever they say
        return sum(m["role"] == "assistant" for m in messages) >= 2, 0.5

      def step(self, messages):
        done, reward = self.turn_outcome(messages, [])
        if done:
          return envs.StepResult([], reward, True)
        calls = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                 '<tool_call>{"name": "wait", "arguments": {"seconds": 30}}</tool_call>',
                 '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
                 '<tool_call>not json</tool_call>']
        replies = [self.call_tool(c) for call in calls for c in envs.parse_tool_calls(call)]
        return envs.StepResult([{"role": "tool", "content": " | ".join(replies)}], reward,
                               False)
''')


def train(workdir, *flags):
  """`python -m launch.train --config=grpo:runlocal ...`: a process (its exit status, stdout,
  stderr), forked from one that has the libraries imported already (tests/cli_runs.py; what
  is checked is the command's outcome: its exit status, stderr and the files it writes)."""
  return cli_runs.run("launch.train", ["--config=grpo:runlocal", f"--workdir={workdir}", *flags],
                      env=dict(os.environ, JAX_PLATFORMS="cpu"), cwd=REPO, timeout=600)


class AgentCliTest(absltest.TestCase):

  @pytest.mark.slow("a `python -m launch.train` run of a user's environment file (the CLI "
                    "path): a step of 8 episodes with tool calls (the program of each turn "
                    "compiled), each episode's wait tool timing out after 1 s and its worker "
                    "started again")
  def test_a_user_env_file_trains_and_writes_rollouts(self):
    root = tempfile.mkdtemp()
    # The tools by name only: their schemas would make a 620-token prompt.
    model_dir = agent_testing.make_model_dir(os.path.join(root, "model"),
                                             chat_template=envs.CHAR_TOOL_NAMES_TEMPLATE,
                                             eos_logit=2.0)
    env_file = os.path.join(root, "user_env.py")
    with open(env_file, "w") as f:
      f.write(USER_ENV)
    workdir = os.path.join(root, "run")
    run = train(workdir, "--config.train.steps=1", f"--config.model.path={model_dir}",
                f"--config.data.env={env_file}:UserEnv", "--config.data.max_episode_tokens=640",
                "--config.data.tool_timeout_s=1", "--config.sampling.max_new_tokens=16",
                "--config.logging.rollouts_every=1", "--config.logging.trackers=jsonl")
    self.assertEqual(run.returncode, 0, run.stderr[-3000:])
    with open(os.path.join(workdir, "rollouts.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    self.assertLen(rows, 1 * 2 * 4)  # 1 step x 2 prompts x 4 samples (runlocal)
    stepped = [r for r in rows if len(r["turn_roles"]) > 2]
    self.assertNotEmpty(stepped)
    tool = next(m["content"] for m in stepped[0]["messages"] if m["role"] == "tool")
    self.assertEqual(tool.split(" | ")[0], "5")
    self.assertIn("did not finish within 1 s and was stopped", tool)
    self.assertIn("unknown tool 'nope'", tool)
    self.assertIn("bad arguments for tool 'add'", tool)
    self.assertIn("not valid JSON", tool)
    tokenizer = data.load_tokenizer(model_dir)
    for r in rows:
      # The opening is in the row: its messages and the tools the template rendered into it
      # ("S:Tools: add wait<eos>") give the row's first tokens.
      self.assertEqual([t["function"]["name"] for t in r["tools"]], ["add", "wait"])
      opening = tokenizer.apply_chat_template(r["messages"][:r["turn_messages"][0]],
                                              tools=r["tools"], tokenize=False,
                                              add_generation_prompt=True)
      self.assertEqual(tokenizer.encode(opening, add_special_tokens=False),
                       r["tokens"][:r["turn_tokens"][0]])
      self.assertEqual(len(r["tokens"]), len(r["loss_mask"]))
      self.assertEqual(len(r["tokens"]), len(r["behaviour_logprobs"]))
      self.assertEqual(sum(r["turn_tokens"]), len(r["tokens"]))
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      metrics = [json.loads(line) for line in f]
    counted = sum(m.get("env/tool_calls", 0) for m in metrics)
    self.assertEqual(counted, 5 * len(stepped))
    self.assertEqual(sum(m.get("env/tool_timeout", 0) for m in metrics), len(stepped))

  def test_a_template_that_cannot_render_episodes_exits_2_in_one_line(self):
    root = tempfile.mkdtemp()
    model_dir = agent_testing.make_model_dir(os.path.join(root, "model"))
    os.remove(os.path.join(model_dir, "chat_template.jinja"))  # no template at all
    workdir = os.path.join(root, "run")
    run = train(workdir, f"--config.model.path={model_dir}",
                f"--config.data.env={agent_testing.SCRIPTED_ENV}:ScriptedEnv")
    self.assertEqual(run.returncode, 2, run.stderr[-3000:])
    self.assertIn("has no chat template", run.stderr)
    self.assertLen(run.stderr.strip().splitlines()[-1:], 1)
    self.assertFalse(os.path.exists(workdir) and os.listdir(workdir))


if __name__ == "__main__":
  absltest.main()
