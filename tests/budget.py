"""The suite's time budget, kept by the suite itself (a pytest plugin; tests/conftest.py
loads it).

- Files run longest first (`file_durations.json`, seconds per file as last recorded), so
  that pytest-xdist's two workers, each taking whole files, end together instead of one
  waiting on the other's last long file. `make test` passes `--no-loadscope-reorder`
  (xdist's own order is by the number of tests per file).
- At the end, the budget: every test over `TEST_LIMIT_S` and every file over
  `FILE_LIMIT_S`, each with the reason it must be that slow. The reason is a marker:
  `@pytest.mark.slow("why")` on the test (or its class), `pytestmark =
  pytest.mark.slow_file("why")` in the module. A test or file over its limit without one is
  listed as such: make it cheaper (docs/testing.md), or say why it cannot be.
- `--write-durations` records the per-file seconds in `file_durations.json`.
- `make test` runs two sessions (tests/conftest.py: the `mesh` tests on 8 devices, then the
  rest on 1); with JAXRL_TEST_BUDGET naming a folder, each leaves its figures there and the
  last one's listing covers both.

Timings depend on the machine and its load, so the budget is a listing, not a failure.
"""
from __future__ import annotations

import collections
import json
import os
import time

import pytest

TEST_LIMIT_S = 30.0
FILE_LIMIT_S = 90.0
SUITE_BUDGET_S = 20 * 60  # `make test` from a clean clone, install included, on 2 cores
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_durations.json")


def pytest_addoption(parser):
  parser.addoption("--write-durations", action="store_true",
                   help=f"record this run's seconds per test file in {DURATIONS}")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow(reason): a test over 30 s, and why it must be")
  config.addinivalue_line("markers", "slow_file(reason): a test file over 90 s, and why")
  config.stash[_START] = time.time()


def _file_of(nodeid: str) -> str:
  return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session, config, items):
  """Longest files first (unknown files first of all: they may be slow), each file's tests
  in their own order."""
  try:
    with open(DURATIONS) as f:
      seconds = json.load(f)
  except FileNotFoundError:
    return
  position = {}
  for i, item in enumerate(items):
    position.setdefault(_file_of(item.nodeid), i)
  items.sort(key=lambda item: (-seconds.get(_file_of(item.nodeid), float("inf")),
                               position[_file_of(item.nodeid)]))


def _reason(item, name: str) -> str | None:
  marker = item.get_closest_marker(name)
  return None if marker is None else (marker.args[0] if marker.args else "")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  # Carried to the controller with every report (items exist only in xdist's workers).
  for name in ("slow", "slow_file"):
    if (reason := _reason(item, name)) is not None and (name, reason) not in item.user_properties:
      item.user_properties.append((name, reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  if hasattr(config, "workerinput"):  # an xdist worker: the controller reports its tests
    return
  session = _this_session(terminalreporter, time.time() - config.stash[_START])
  if not session["tests"]:
    return
  sessions = _with_earlier_sessions(session)
  tests, reasons, files = {}, {}, collections.Counter()
  for s in sessions:
    tests.update(s["tests"])
    reasons.update(s["reasons"])
  for key, seconds in tests.items():
    files[_file_of(key)] += seconds
  if config.getoption("write_durations"):
    with open(DURATIONS, "w") as f:
      json.dump({k: round(v, 1) for k, v in sorted(files.items())}, f, indent=0)
      f.write("\n")
  wall = sum(s["wall"] for s in sessions)
  write = terminalreporter.write_line
  terminalreporter.section("the suite's budget")
  write(f"{len(tests)} tests in {wall:.0f} s wall ({len(sessions)} session(s), "
        f"{sum(tests.values()):.0f} s of test time); `make test` has {SUITE_BUDGET_S // 60} "
        f"min on 2 cores, install included. Over {TEST_LIMIT_S:.0f} s a test, "
        f"{FILE_LIMIT_S:.0f} s a file:")
  over = [(s, k) for k, s in tests.items() if s > TEST_LIMIT_S]
  over += [(s, k) for k, s in files.items() if s > FILE_LIMIT_S]
  unexplained = 0
  for seconds, key in sorted(over, reverse=True):
    reason = reasons.get(key)
    unexplained += reason is None
    why = reason if reason is not None else (
        "NO REASON GIVEN: make it cheaper (docs/testing.md) or mark it "
        + ("@pytest.mark.slow('why')" if "::" in key else "pytestmark = pytest.mark.slow_file('why')"))
    write(f"{seconds:7.1f} s  {key}\n           {why}")
  if unexplained:
    write(f"{unexplained} over the limit with no reason given", yellow=True, bold=True)


def _this_session(terminalreporter, wall: float) -> dict:
  """{tests: {nodeid: seconds}, reasons: {nodeid or file: reason}, wall}."""
  tests, reasons = collections.Counter(), {}
  for reports in terminalreporter.stats.values():
    for report in reports:
      if not isinstance(report, pytest.TestReport):
        continue
      tests[report.nodeid] += report.duration
      for name, reason in report.user_properties:
        reasons[report.nodeid if name == "slow" else _file_of(report.nodeid)] = reason
  return {"tests": dict(tests), "reasons": reasons, "wall": wall}


def _with_earlier_sessions(session: dict) -> list[dict]:
  """`make test` runs two sessions (8 devices, then 1) and sets JAXRL_TEST_BUDGET to a
  folder where each leaves its figures: the last one lists the whole suite's."""
  folder = os.environ.get("JAXRL_TEST_BUDGET")
  if not folder:
    return [session]
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, f"session_{os.getpid()}.json"), "w") as f:
    json.dump(session, f)
  sessions = []
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name)) as f:
      sessions.append(json.load(f))
  return sessions


_START = pytest.StashKey[float]()
