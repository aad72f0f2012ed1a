r"""Math answers checked by Hugging Face's math-verify: `\boxed{\sqrt{8}}` equals `2\sqrt{2}`.

Reward function (dataset field `answer`: a number, a final answer such as `"42"`,
`"\\frac{1}{2}"` or `"[1, 2)"`, or a full GSM8K solution ending in `#### 42`):
  math_verify  1.0 if the completion's final answer is equivalent to the reference answer
               (`math_verify.verify`: numbers, fractions vs decimals, symbolic expressions,
               sets, intervals), else 0.0, also for a completion with no answer or junk.

The completion's final answer is the text after its last `####` when that comes after its
last `\boxed{}` (GSM8K's marker, as `jaxrl_llm.rewards.gsm8k` reads it); otherwise what
`math_verify.parse` finds with an anchor: `\boxed{...}`, "the final answer is ...",
"answer: ...". Unlike the default of `parse`, an unmarked number is not an answer (a
truncated completion ends on numbers too). Where `gsm8k.gsm8k_exact` also reads an answer the
two agree on GSM8K's integers, decimals, `1,234`, `$18` and `\frac{a}{b}`; they differ
(tests/rewards/math_verify_test.py, DIFFERENCES) on "The answer is 72" with no `####` or box
(gsm8k: no answer), several boxes (math-verify: their set; gsm8k: the last), an unclosed box
(gsm8k reads it), numbers equal to 6 decimals (`0.333333` for 1/3), percentages (50\% = 0.5)
and expressions (`\sqrt{8}`, `2 + 3`, where gsm8k reads the first number).

Threads and timeouts: math-verify bounds `parse` and `verify` with `signal.alarm`, which
raises ValueError off the main thread, and rewards are scored in the rollout thread with
`config.algo.max_async_level >= 1` (`training/async_rollouts.py`). So both run with their
timeouts off (`parsing_timeout=None`, `timeout_seconds=None`), in a child process
(`math_worker`) that is killed and restarted when one sample takes over `TIMEOUT_S`: sympy
can spend minutes or hours on an answer such as `\boxed{9^{9^{9^{9}}}}`, and a thread cannot
be stopped. Such a sample scores 0.0. A result is deterministic except for an answer whose
check takes close to `TIMEOUT_S`; a usual one takes about a millisecond.
"""
import atexit
import decimal
import importlib.util
import json
import numbers
import os
import select
import subprocess
import sys
import threading
import time

TIMEOUT_S = 5.0  # per sample, parse and verify (math-verify's own default for each)
START_TIMEOUT_S = 120.0  # the child imports sympy: about 2 s on an idle machine
MAX_MARKED_CHARS = 1000  # a `####` line is read this far at most

if importlib.util.find_spec("math_verify") is None:  # fail as the config loads, not at step 0
  raise ModuleNotFoundError("jaxrl_llm.rewards.math needs the package math-verify, which is "
                            "not installed: pip install 'math-verify>=0.9'")


def reference_text(answer) -> str:
  """A dataset's `answer` field as the final answer's text: a number, a final answer, or
  the line after the last `####` of a GSM8K solution."""
  if isinstance(answer, numbers.Integral) and not isinstance(answer, bool):
    return str(int(answer))
  if isinstance(answer, numbers.Real) and not isinstance(answer, bool):
    return f"{decimal.Decimal(repr(float(answer))):f}"  # 1e-05 -> 0.00001: plain digits parse
  answer = str(answer)
  hash_at = answer.rfind("####")
  if hash_at >= 0:
    return answer[hash_at + 4:].partition("\n")[0].strip()
  return answer.strip()


def completion_answer(completion: str) -> tuple[str, bool]:
  r"""(text, marked): the line after the completion's last `####` when that follows its last
  box (marked), else the whole completion for math-verify to search. `\fbox` counts as
  `\boxed`."""
  text = completion.replace("\\fbox{", "\\boxed{")
  hash_at = text.rfind("####")
  if hash_at > text.rfind("\\boxed"):
    return text[hash_at + 4:].partition("\n")[0].strip()[:MAX_MARKED_CHARS], True
  return text, False


class _Worker:
  """The `math_worker` child process, started on first use and after a timeout."""

  def __init__(self):
    self._lock = threading.Lock()  # one request at a time, from any thread
    self._proc = None
    self._pending = b""  # bytes read past the last reply

  def check(self, reference: str, answer: str, marked: bool) -> str:
    """The child's reply ('1', '0', '?'); '0' when it took over `TIMEOUT_S` or died."""
    request = (json.dumps([reference, answer, marked]) + "\n").encode()
    with self._lock:
      if self._proc is None or self._proc.poll() is not None:  # first use, or it died idle
        self.stop()
        self._start()
      try:
        self._proc.stdin.write(request)
        self._proc.stdin.flush()
        reply = self._read_line(TIMEOUT_S)
      except OSError:  # the child died (say, out of memory) and closed its end
        reply = None
      except BaseException:  # KeyboardInterrupt: its reply would answer the next request
        self.stop()
        raise
      if reply is None:
        self.stop()
        return "0"
      return reply

  def _start(self) -> None:
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    self._proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", "jaxrl_llm.rewards.math_worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=path))
    if self._read_line(START_TIMEOUT_S) != "ready":
      self.stop()
      raise RuntimeError(f"jaxrl_llm.rewards.math_worker did not start within "
                         f"{START_TIMEOUT_S:.0f} s (its error, if any, is on stderr)")

  def _read_line(self, timeout_s: float) -> str | None:
    """The child's next line, or None when it sends none within `timeout_s` or exits."""
    deadline = time.monotonic() + timeout_s
    fd = self._proc.stdout.fileno()
    readable = select.poll()  # not select.select: a trainer's descriptors can pass 1024
    readable.register(fd, select.POLLIN)
    while b"\n" not in self._pending:
      left = deadline - time.monotonic()
      if left <= 0 or not readable.poll(left * 1000):
        return None
      chunk = os.read(fd, 4096)
      if not chunk:
        return None
      self._pending += chunk
    line, _, self._pending = self._pending.partition(b"\n")
    return line.decode()

  def stop(self) -> None:
    """Kills the child (a later check starts another)."""
    if self._proc is not None:
      self._proc.kill()
      self._proc.wait()
      for pipe in (self._proc.stdin, self._proc.stdout):
        pipe.close()
    self._proc, self._pending = None, b""


_WORKER = _Worker()
atexit.register(_WORKER.stop)


def math_verify(prompts: list[str], completions: list[str], answer: list,
                **unused_fields) -> list[float]:
  """1.0 where the completion's final answer is equivalent to the reference `answer`."""
  del prompts, unused_fields
  rewards = []
  for completion, reference in zip(completions, answer, strict=True):
    text, marked = completion_answer(completion)
    reply = _WORKER.check(reference_text(reference), text, marked)
    if reply == "?":
      raise ValueError(f"reference answer {str(reference)[-80:]!r} holds no answer "
                       "math-verify can parse")
    rewards.append(float(reply == "1"))
  return rewards
