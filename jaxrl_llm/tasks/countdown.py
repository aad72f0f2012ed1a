"""`task:countdown`: reach a target from given numbers with + - * /.

  record      {'prompt': 'Use 3 5 8 1 to make 24:', 'numbers': [3, 5, 8, 1],
               'target': 24, 'solution': '(5-3+1)*8'}
  completion  an expression on one line using each given number at most once,
              e.g. '8*3', then EOS. Anything from an `=` on is ignored.

Every target is reachable: it is made by combining a random subset of the
numbers with random operators, keeping every intermediate value a positive
integer (exact divisions only), and that expression is the record's `solution`
(the SFT demonstration). With the defaults a prompt is at most 28 characters.

Rewards: `jaxrl_llm.rewards.countdown:countdown_exact` (the verifier: exact
fractions, each number at most once) and `...:countdown_format`.
"""
import functools
import random
from typing import Sequence

from jaxrl_llm.tasks import base

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3
_MAX_DRAWS = 1000  # attempts at a target within [1, max_target]


def _combine(a, b, op):
  """`a op b` for (value, text, precedence) items, with minimal parentheses."""
  (va, ta, pa), (vb, tb, pb) = a, b
  prec = _PRECEDENCE[op]
  if pa < prec:
    ta = f"({ta})"
  if pb < prec or (pb == prec and op in "-/"):
    tb = f"({tb})"
  value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va // max(vb, 1)}[op]
  return value, f"{ta}{op}{tb}", prec


def _random_expression(rng: random.Random, values: list[int]):
  """Combines `values` pairwise with random operators; positive integer steps only."""
  items = [(v, str(v), _ATOM) for v in values]
  while len(items) > 1:
    a = items.pop(rng.randrange(len(items)))
    b = items.pop(rng.randrange(len(items)))
    op = rng.choice("+-*/")
    if op == "-" and a[0] == b[0]:
      op = "+"
    if op == "-" and a[0] < b[0]:
      a, b = b, a
    if op == "/" and a[0] % b[0]:
      a, b = b, a
      if a[0] % b[0]:
        op = "*"
    items.append(_combine(a, b, op))
  return items[0]


def make_problem(rng: random.Random, *, num_numbers: int = 4, max_number: int = 20,
                 max_target: int = 100) -> dict:
  """Draws one solvable problem (see the module docstring)."""
  for _ in range(_MAX_DRAWS):
    numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
    used = rng.sample(numbers, rng.randint(min(2, num_numbers), num_numbers))
    target, solution, _ = _random_expression(rng, used)
    if 1 <= target <= max_target:
      prompt = f"Use {' '.join(map(str, numbers))} to make {target}:"
      return {"prompt": prompt, "numbers": numbers, "target": target,
              "solution": solution}
  raise ValueError(f"countdown: no target within [1, {max_target}] in {_MAX_DRAWS} "
                   "draws; raise max_target.")


def load_split(split: str, *, seed: int = 0, num_train: int = 100_000,
               num_eval: int = 500, num_numbers: int = 4, max_number: int = 20,
               max_target: int = 100) -> Sequence[dict]:
  """The 'train' or 'eval' split; see `tasks.base` for how splits are drawn.

  Args:
    split: 'train' or 'eval' (disjoint prompts).
    seed: the splits' seed.
    num_train: train records (drawn on demand).
    num_eval: eval records, all distinct.
    num_numbers: numbers given per problem.
    max_number: the numbers are drawn from [1, max_number].
    max_target: targets lie in [1, max_target].

  Returns:
    Records `{'prompt', 'numbers': list[int], 'target': int, 'solution': str}`.
  """
  if num_numbers < 1 or max_number < 1 or max_target < 1:
    raise ValueError("countdown: num_numbers, max_number and max_target must be >= 1, "
                     f"got {num_numbers}, {max_number}, {max_target}.")
  make = functools.partial(make_problem, num_numbers=num_numbers,
                           max_number=max_number, max_target=max_target)
  return base.make_split(make, task="countdown", split=split, seed=seed,
                         num_train=num_train, num_eval=num_eval)


def demonstration(record: dict, rng=None) -> str:
  """The target completion: the record's known solution (`rng` unused)."""
  del rng
  return record["solution"]


TASK = base.Task(load_split=load_split, demonstration=demonstration,
                 **base.exact_and_format_rewards("countdown"))
