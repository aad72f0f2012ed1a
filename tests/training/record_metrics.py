"""Records the metrics the unchanged-metrics tests compare against, after a deliberate change
of the numbers (say why in the tests' docstrings):

  python -m tests.training.record_metrics

Runs every case of `unchanged_metrics_test` and the golden run of `async_test` on 2 of 8
fake CPU devices, as the tests do, and rewrites `metrics_recorded.json` and
`sync_metrics_recorded.json`.
"""
import json
import os
import tempfile

from tests import conftest  # noqa: F401  (8 fake CPU devices, before jax starts)
from tests.training import async_test, unchanged_metrics_test


def main():
  cases = {}
  for name in sorted(unchanged_metrics_test.CASES):
    cases[name] = unchanged_metrics_test.run_case(name, tempfile.mkdtemp())
    print(f"{name}: {len(cases[name])} rows", flush=True)
  with open(unchanged_metrics_test.RECORDED, "w") as f:
    json.dump(cases, f, indent=1, sort_keys=True)
  golden = async_test.run_golden(tempfile.mkdtemp())
  with open(async_test.RECORDED, "w") as f:
    json.dump(golden, f, indent=1, sort_keys=True)
  print(f"wrote {os.path.basename(unchanged_metrics_test.RECORDED)} and "
        f"{os.path.basename(async_test.RECORDED)}")


if __name__ == "__main__":
  main()
