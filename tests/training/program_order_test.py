"""The trainer and the rollout thread take turns in one order fixed by (k, start)."""
import random
import threading
import time

from absl.testing import absltest

from jaxrl_llm.training import async_rollouts


def run_turns(start, steps, k, jitter_seed):
  """Both threads take all their turns, each sleeping at random; returns the turns' order."""
  closed = threading.Event()
  order = async_rollouts.ProgramOrder(start, steps, k, closed)
  log, lock = [], threading.Lock()
  rng = random.Random(jitter_seed)
  delays = [rng.random() * 2e-3 for _ in range(4 * steps)]

  def take(turn, name):
    with turn:
      with lock:
        log.append(name)
      time.sleep(delays[len(log) % len(delays)])

  def rollouts():
    for s in range(start, steps):
      take(order.rollout(s), f"R{s}")
  thread = threading.Thread(target=rollouts)
  thread.start()
  for v in range(start - 1, steps):
    take(order.trainer(v), f"T{v}")
  thread.join()
  return log


class ProgramOrderTest(absltest.TestCase):

  def test_one_order_whatever_the_timing(self):
    for start, steps, k, want in (
        (0, 4, 1, "T-1 R0 R1 T0 R2 T1 R3 T2 T3"),
        (0, 4, 2, "T-1 R0 R1 R2 T0 R3 T1 T2 T3"),
        (2, 5, 1, "T1 R2 R3 T2 R4 T3 T4"),
        (0, 2, 3, "T-1 R0 R1 T0 T1")):
      for seed in range(5):
        self.assertEqual(" ".join(run_turns(start, steps, k, seed)), want,
                         f"start={start} steps={steps} k={k} seed={seed}")

  def test_a_closed_pipeline_releases_a_waiting_thread(self):
    closed = threading.Event()
    order = async_rollouts.ProgramOrder(0, 4, 1, closed)
    raised = []

    def wait_for_r2():  # R2 follows T0, which nobody takes
      try:
        with order.rollout(2):
          pass
      except async_rollouts.Closed:
        raised.append(True)
    thread = threading.Thread(target=wait_for_r2)
    thread.start()
    closed.set()
    thread.join(timeout=5)
    self.assertFalse(thread.is_alive())
    self.assertEqual(raised, [True])

  def test_an_abandoned_rollout_thread_does_not_hold_the_trainer(self):
    order = async_rollouts.ProgramOrder(0, 4, 1, threading.Event())
    with order.trainer(-1):
      pass
    order.abandon()  # the rollout thread failed before its first turn
    for v in range(4):
      with order.trainer(v):
        pass


if __name__ == "__main__":
  absltest.main()
