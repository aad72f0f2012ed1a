"""Mixed batches: counts follow the weights, every source is its own resumable stream, and
processes split each global batch."""
from absl.testing import absltest
import numpy as np

from jaxrl_llm import data


def datasets():
  return {"a": [{"prompt": f"a{i}"} for i in range(7)],
          "b": [{"prompt": f"b{i}"} for i in range(5)],
          "c": [{"prompt": f"c{i}"} for i in range(3)]}


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


class MixCountsTest(absltest.TestCase):

  def test_largest_remainders(self):
    self.assertEqual(data.mix_counts([1, 1], 4), [2, 2])
    self.assertEqual(data.mix_counts([0.75, 0.25], 4), [3, 1])
    self.assertEqual(data.mix_counts([0.25, 0.5], 4), [1, 3])  # quotas 1.33 / 2.67
    self.assertEqual(data.mix_counts([1, 1, 1], 4), [2, 1, 1])  # a tie goes to the first
    self.assertEqual(data.mix_counts([0, 3], 5), [0, 5])
    with self.assertRaisesRegex(ValueError, "at least one > 0"):
      data.mix_counts([0, 0], 4)


class MixedBatchesTest(absltest.TestCase):

  def test_each_source_is_its_own_epoch_stream(self):
    weights = {"a": 2, "b": 1, "c": 1}
    batches = take(data.mixed_batches(datasets(), weights, 4, seed=3), 6)
    for batch in batches:
      self.assertEqual(batch.sources.tolist(), [0, 0, 1, 2])
      self.assertEqual([p[0] for p in batch.prompts], ["a", "a", "b", "c"])
    # c (3 records, one a batch): every epoch visits each record once.
    c = [b.prompts[3] for b in batches]
    self.assertCountEqual(c[:3], ["c0", "c1", "c2"])
    self.assertCountEqual(c[3:], ["c0", "c1", "c2"])
    self.assertEqual(batches[-1].source_positions, {"a": 12, "b": 6, "c": 6})
    self.assertEqual([b.position for b in batches], list(range(6)))

  def test_resume_from_positions(self):
    weights = {"a": 2, "b": 1, "c": 1}
    whole = take(data.mixed_batches(datasets(), weights, 4, seed=3), 5)
    resumed = take(data.mixed_batches(datasets(), weights, 4, seed=3, start=2,
                                      positions=whole[1].source_positions), 3)
    self.assertEqual([b.prompts for b in resumed], [b.prompts for b in whole[2:]])
    # A new mix on resume continues each stream where it stopped.
    shifted = next(data.mixed_batches(datasets(), {"a": 1, "b": 0, "c": 3}, 4, seed=3, start=2,
                                      positions=whole[1].source_positions))
    self.assertEqual(shifted.prompts[0], whole[2].prompts[0])
    self.assertEqual(shifted.prompts[1], whole[2].prompts[3])

  def test_two_sources_of_the_same_data_draw_different_orders(self):
    same = {"x": datasets()["a"], "y": datasets()["a"]}
    batch = next(data.mixed_batches(same, {"x": 1, "y": 1}, 14, seed=0))
    self.assertNotEqual(batch.prompts[:7], batch.prompts[7:])
    self.assertCountEqual(batch.prompts[:7], batch.prompts[7:])

  def test_processes_split_each_global_batch(self):
    weights = {"a": 1, "b": 2, "c": 1}
    whole = take(data.mixed_batches(datasets(), weights, 8, seed=1), 3)
    parts = [take(data.mixed_batches(datasets(), weights, 8, seed=1, process_index=p,
                                     process_count=2), 3) for p in range(2)]
    for k in range(3):
      self.assertEqual(parts[0][k].prompts + parts[1][k].prompts, whole[k].prompts)
      np.testing.assert_array_equal(np.concatenate([parts[0][k].sources, parts[1][k].sources]),
                                    whole[k].sources)

  def test_subset_keeps_its_records_fields(self):
    batch = next(data.mixed_batches(
        {"a": [{"prompt": "p", "answer": 1}], "b": [{"prompt": "q", "numbers": [2]}]},
        {"a": 1, "b": 1}, 2, seed=0))
    self.assertEqual(batch.subset(batch.sources == 1).fields(), {"numbers": [[2]]})


if __name__ == "__main__":
  absltest.main()
