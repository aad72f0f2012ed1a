"""A scripted environment for the multi-turn tests (loaded by file path, as a user's is).

After the model's k-th turn it answers with the tool message "r<k>:<length of the turn>"
and reward `reward_per_turn`, until `replies` replies were given; then it is done. With
`fail_prompt`, the record with that prompt raises in `fail_in` ('reset' or 'step').
"""
import time

from jaxrl_llm import envs


class ScriptedEnv(envs.Environment):

  def __init__(self, replies: int = 2, reward_per_turn: float = 0.25, fail_prompt: str = "",
               fail_in: str = "step"):
    super().__init__()
    self.replies, self.reward_per_turn = replies, reward_per_turn
    self.fail_prompt, self.fail_in = fail_prompt, fail_in

  def reset(self, record):
    if self.fail_in == "reset" and record["prompt"] == self.fail_prompt:
      raise RuntimeError("scripted failure in reset")
    return [{"role": "user", "content": record["prompt"]}]

  def step(self, messages):
    if self.fail_in == "step" and messages[0]["content"] == self.fail_prompt:
      raise RuntimeError("scripted failure in step")
    k = sum(m["role"] == "assistant" for m in messages)
    if k > self.replies:
      return [], self.reward_per_turn, True
    return ([{"role": "tool", "content": f"r{k}:{len(messages[-1]['content'])}"}],
            self.reward_per_turn, False)


class TimedEnv(envs.Environment):
  """ScriptedEnv's replies after a delay that depends on the record: `delays` maps a prompt
  to the seconds each `step` sleeps (0 for others). Every call is logged in `events` as
  (prompt, 'reset' | 'step', the model's turns so far, monotonic start, monotonic end)."""

  def __init__(self, replies: int = 2, delays: dict | None = None):
    super().__init__()
    self.replies, self.delays, self.events = replies, dict(delays or {}), []

  def reset(self, record):
    now = time.monotonic()
    self.events.append((record["prompt"], "reset", 0, now, now))
    return [{"role": "user", "content": record["prompt"]}]

  def step(self, messages):
    start = time.monotonic()
    prompt = messages[0]["content"]
    time.sleep(self.delays.get(prompt, 0.0))
    k = sum(m["role"] == "assistant" for m in messages)
    self.events.append((prompt, "step", k, start, time.monotonic()))
    if k > self.replies:
      return [], 0.0, True
    return [{"role": "tool", "content": f"r{k}"}], 0.0, False
