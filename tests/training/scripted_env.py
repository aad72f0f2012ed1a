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
  (prompt, 'reset' | 'step', the model's turns so far, monotonic start, monotonic end).

  `gates` maps a prompt to (reset_at, step_at): its `reset` waits until `opened` (which a
  test raises) is at least reset_at, and its first `step` (after the model's first turn)
  until it is at least step_at; `waiting` counts the first steps waiting now."""

  def __init__(self, replies: int = 2, delays: dict | None = None, gates: dict | None = None):
    super().__init__()
    self.replies, self.delays, self.events = replies, dict(delays or {}), []
    self.gates = {prompt: tuple(at) for prompt, at in (gates or {}).items()}
    self.opened, self.waiting = 0, 0

  def _wait_until_opened(self, at: int) -> None:
    while self.opened < at:
      time.sleep(0.002)

  def reset(self, record):
    self._wait_until_opened(self.gates.get(record["prompt"], (0, 0))[0])
    now = time.monotonic()
    self.events.append((record["prompt"], "reset", 0, now, now))
    return [{"role": "user", "content": record["prompt"]}]

  def step(self, messages):
    prompt = messages[0]["content"]
    k = sum(m["role"] == "assistant" for m in messages)
    if k == 1 and self.opened < self.gates.get(prompt, (0, 0))[1]:
      self.waiting += 1
      self._wait_until_opened(self.gates[prompt][1])
      self.waiting -= 1
    start = time.monotonic()
    time.sleep(self.delays.get(prompt, 0.0))
    self.events.append((prompt, "step", k, start, time.monotonic()))
    if k > self.replies:
      return [], 0.0, True
    return [{"role": "tool", "content": f"r{k}"}], 0.0, False
