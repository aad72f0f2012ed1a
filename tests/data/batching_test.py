"""Batch order: deterministic, exactly resumable, sliced per process."""
import itertools

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jaxrl_llm import data


class CountingDataset:
  """Records `{'prompt': 'p<i>', 'i': i}`; counts which indices were read."""

  def __init__(self, size):
    self.size = size
    self.reads = []

  def __len__(self):
    return self.size

  def __getitem__(self, i):
    self.reads.append(i)
    return {"prompt": f"p{i}", "i": i}


def take(iterator, n):
  return list(itertools.islice(iterator, n))


def stream(batches):
  return np.concatenate([b.indices for b in batches])


class PromptBatchesTest(parameterized.TestCase):

  def test_epochs_are_permutations(self):
    batches = take(data.prompt_batches(CountingDataset(10), 5, seed=0), 6)  # 3 epochs
    order = stream(batches)
    for epoch in range(3):
      self.assertCountEqual(order[10 * epoch:10 * (epoch + 1)], range(10))
    self.assertFalse(np.array_equal(order[:10], order[10:20]))  # reshuffled
    self.assertFalse(np.array_equal(order[:10], np.arange(10)))  # shuffled at all
    self.assertEqual([b.position for b in batches], list(range(6)))
    self.assertEqual(batches[0].prompts, [f"p{i}" for i in batches[0].indices])

  def test_batches_cross_epoch_boundaries(self):
    order = stream(take(data.prompt_batches(CountingDataset(10), 4, seed=1), 5))  # 20 items
    self.assertCountEqual(order[:10], range(10))
    self.assertCountEqual(order[10:], range(10))

  def test_batch_larger_than_dataset(self):
    batch = next(data.prompt_batches(CountingDataset(3), 7, seed=0))
    self.assertLen(batch.records, 7)
    self.assertCountEqual(batch.indices[:3], range(3))
    self.assertCountEqual(batch.indices[3:6], range(3))

  def test_no_shuffle_keeps_dataset_order(self):
    order = stream(take(data.prompt_batches(CountingDataset(5), 3, seed=0,
                                            epoch_shuffle=False), 3))
    self.assertEqual(order.tolist(), [0, 1, 2, 3, 4, 0, 1, 2, 3])

  def test_deterministic_and_seeded(self):
    a = stream(take(data.prompt_batches(CountingDataset(50), 8, seed=7), 10))
    b = stream(take(data.prompt_batches(CountingDataset(50), 8, seed=7), 10))
    c = stream(take(data.prompt_batches(CountingDataset(50), 8, seed=8), 10))
    np.testing.assert_array_equal(a, b)
    self.assertFalse(np.array_equal(a, c))

  @parameterized.parameters(0, 1, 3, 6, 7, 12)
  def test_resume_at_any_position_matches_a_continuous_run(self, k):
    continuous = take(data.prompt_batches(CountingDataset(23), 6, seed=3), 15)
    resumed = take(data.prompt_batches(CountingDataset(23), 6, seed=3, start=k), 15 - k)
    self.assertEqual([b.position for b in resumed], list(range(k, 15)))
    for a, b in zip(continuous[k:], resumed):
      np.testing.assert_array_equal(a.indices, b.indices)
      self.assertEqual(a.records, b.records)

  def test_resume_reads_only_what_it_yields(self):
    dataset = CountingDataset(1000)
    next(data.prompt_batches(dataset, 4, seed=0, start=10_000))
    self.assertLen(dataset.reads, 4)

  @parameterized.parameters(1, 2, 4)
  def test_processes_take_contiguous_slices_and_only_read_them(self, count):
    full = take(data.prompt_batches(CountingDataset(37), 8, seed=5, start=2), 6)
    for p in range(count):
      dataset = CountingDataset(37)
      mine = take(data.prompt_batches(dataset, 8, seed=5, start=2, process_index=p,
                                      process_count=count), 6)
      size = 8 // count
      for whole, part in zip(full, mine):
        np.testing.assert_array_equal(part.indices, whole.indices[p * size:(p + 1) * size])
        self.assertEqual(part.position, whole.position)
      self.assertEqual(dataset.reads, stream(mine).tolist())

  def test_fields(self):
    batch = data.RecordBatch(position=0, indices=np.arange(2),
                             records=[{"prompt": "a", "answer": 1},
                                      {"prompt": "b", "numbers": [2]}],
                             valid=np.ones(2, bool))
    self.assertEqual(batch.fields(), {"answer": [1, None], "numbers": [None, [2]]})
    self.assertEqual(batch.fields(repeat=3)["answer"], [1, 1, 1, None, None, None])

  @parameterized.parameters(
      dict(batch_size=0, message="batch_size must be >= 1"),
      dict(batch_size=6, process_count=4, process_index=0, message="does not split evenly"),
      dict(batch_size=8, process_count=2, process_index=2, message="process_index 2"),
      dict(batch_size=8, position=-1, message="position must be >= 0"),
  )
  def test_bad_arguments(self, message, batch_size, position=0, process_index=0,
                         process_count=1):
    with self.assertRaisesRegex(ValueError, message):
      data.batch_indices(10, batch_size, position, seed=0, process_index=process_index,
                         process_count=process_count)


class SequentialBatchesTest(absltest.TestCase):

  def test_one_padded_pass(self):
    batches = list(data.sequential_batches(CountingDataset(10), 4))
    self.assertLen(batches, 3)
    self.assertEqual(stream(batches).tolist(), list(range(10)) + [0, 0])
    self.assertEqual(np.concatenate([b.valid for b in batches]).tolist(),
                     [True] * 10 + [False] * 2)

  def test_processes_share_the_pass(self):
    parts = [list(data.sequential_batches(CountingDataset(10), 4, process_index=p,
                                          process_count=2)) for p in range(2)]
    self.assertLen(parts[0], 3)
    self.assertLen(parts[1], 3)
    valid = [i for batches in zip(*parts) for b in batches
             for i, ok in zip(b.indices, b.valid) if ok]
    self.assertEqual(valid, list(range(10)))


if __name__ == "__main__":
  absltest.main()
