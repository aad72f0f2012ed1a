"""hlo_cost: loops counted as often as they run, checked against XLA:TPU's own cost analysis
of programs compiled for a v5e:2x2 slice on this CPU host (compile only), and against
numbers worked out by hand for HLO written here.

XLA's `cost_analysis()` counts a loop's body once; the reference for a loop is therefore
the same work unrolled. Where bytes are compared, both programs are compiled with
XLA:TPU's memory-space assignment off (`xla_msa_enable=False`): with it on, XLA places a
program's arrays in VMEM differently once it is unrolled (it prefetches the whole weight
stack, for one), so the two programs would move different bytes for reasons unrelated to
loops.
"""
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_llm.aot import hlo_cost, hlo_text
from jaxrl_llm.models import moe

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
NO_MSA = {"xla_msa_enable": False}


def _mesh() -> Mesh:
  # libtpu as a compiler only: no TPU VM to look for, several processes may load it.
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
  return Mesh(np.asarray(devices), ("d",))


def _arg(mesh, shape, spec=P()):
  return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))


def _compile(f, *args, options=None, **jit_kwargs):
  """(HLO text, XLA's cost_analysis()) of `f` compiled for the slice."""
  compiled = jax.jit(f, **jit_kwargs).lower(*args).compile(options)
  xla = compiled.cost_analysis()
  return compiled.as_text(), xla[0] if isinstance(xla, list) else xla


# One loop, written by hand: for (i = 2; 10 > i; i += 3) y = x @ w, f32[8,16] x f32[16,16]
# (no layouts: sizes are logical). By hand, i = 2, 5, 8: 3 trips, the condition runs 4 times:
#   FLOPs: 3 x 2*8*16*16 = 12288
#   bytes per trip: the add 3 s32 = 12, the dot x 512 + w 1024 + y 512 = 2048: 2060;
#   per condition: the compare 4 + 4 + pred 1 = 9. Total 3*2060 + 4*9 = 6216.
COUNTED_LOOP = """HloModule counted

%body (p: (s32[], f32[8,16], f32[16,16])) -> (s32[], f32[8,16], f32[16,16]) {
  %p = (s32[], f32[8,16], f32[16,16]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %step = s32[] constant(STEP)
  %next = s32[] OP(%i, %step)
  %x = f32[8,16] get-tuple-element(%p), index=1
  %w = f32[16,16] get-tuple-element(%p), index=2
  %y = f32[8,16] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8,16], f32[16,16]) tuple(%next, %y, %w)
}

%cond (q: (s32[], f32[8,16], f32[16,16])) -> pred[] {
  %q = (s32[], f32[8,16], f32[16,16]) parameter(0)
  %limit = s32[] constant(LIMIT)
  %j = s32[] get-tuple-element(%q), index=0
  ROOT %more = pred[] compare(COMPARED), direction=DIRECTION
}

ENTRY %main (x: f32[8,16], w: f32[16,16]) -> f32[8,16] {
  %x = f32[8,16] parameter(0)
  %w = f32[16,16] parameter(1)
  %start = s32[] constant(START)
  %init = (s32[], f32[8,16], f32[16,16]) tuple(%start, %x, %w)
  %loop = (s32[], f32[8,16], f32[16,16]) while(%init), condition=%cond, body=%body CONFIG
  ROOT %out = f32[8,16] get-tuple-element(%loop), index=1
}
"""


def _loop_text(start=2, op="add", step=3, compared="%limit, %j", limit=10, direction="GT",
               config=""):
  fields = dict(START=start, OP=op, STEP=step, COMPARED=compared, LIMIT=limit,
                DIRECTION=direction, CONFIG=config)
  text = COUNTED_LOOP
  for key, value in fields.items():
    text = text.replace(key, str(value))
  return text


class HandWrittenTest(parameterized.TestCase):

  def test_loop_counted_by_hand(self):
    cost = hlo_cost.program_cost(_loop_text())
    self.assertEqual(cost.loops, (hlo_cost.Loop("loop", trips=3, counted=True, depth=0),))
    self.assertEqual(cost.flops, 12288)
    self.assertEqual(cost.bytes_accessed, 6216)

  @parameterized.named_parameters(
      # i = 2, 5, 8, 11 <= 11: 4 trips
      ("counter_left_le", dict(compared="%j, %limit", limit=11, direction="LE"), 4),
      # i = 30, 25, 20, 15 > 10, counting down: 4 trips
      ("counting_down", dict(start=30, op="subtract", step=5, compared="%j, %limit",
                             direction="GT"), 4),
      # i = 12 is not below 10: none
      ("never_entered", dict(start=12, compared="%j, %limit", direction="LT"), 0),
      # XLA's own trip count wins over the condition
      ("known_trip_count", dict(config=', backend_config={"known_trip_count":{"n":"7"}}'), 7),
  )
  def test_trip_counts(self, fields, trips):
    cost = hlo_cost.program_cost(_loop_text(**fields))
    self.assertEqual(cost.loops[0].trips, trips)
    self.assertEqual(cost.flops, trips * 2 * 8 * 16 * 16)

  def test_counter_compared_with_a_changing_value_needs_dynamic_trips(self):
    text = _loop_text(compared="%j, %j", direction="LT")  # not a counter against a constant
    with self.assertRaisesRegex(ValueError, "while loop 'loop'.*dynamic_trips"):
      hlo_cost.program_cost(text)
    cost = hlo_cost.program_cost(text, dynamic_trips=5)
    self.assertEqual(cost.loops, (hlo_cost.Loop("loop", trips=5, counted=False, depth=0),))

  @parameterized.named_parameters(
      # XLA:TPU's grouped matmul: 4 groups (dimension 0, base-dilated by 4 and strided by 3 so
      # that each output reads its own group) of bf16[5,6] @ [6,7]: 4 * 5*6*7 multiply-adds.
      ("grouped", "f32[4,6,5]", "f32[4,6,7]", "f32[4,5,7]", "size=4 stride=3 lhs_dilate=4",
       "0fb_0io->0bf", 2 * 4 * 5 * 6 * 7),
      # Width 3 over 5 positions padded by 1: 15 taps but 2 read padding; 2 in, 4 out features.
      ("padded", "f32[1,5,2]", "f32[3,2,4]", "f32[1,5,4]", "size=3 pad=1_1", "b0f_0io->b0f",
       2 * 13 * 2 * 4),
  )
  def test_convolution_flops(self, lhs, rhs, out, window, labels, flops):
    text = (f"HloModule conv\n\nENTRY %main (a: {lhs}, b: {rhs}) -> {out} {{\n"
            f"  %a = {lhs} parameter(0)\n  %b = {rhs} parameter(1)\n  ROOT %c = {out} "
            f"convolution(%a, %b), window={{{window}}}, dim_labels={labels}\n}}\n")
    self.assertEqual(hlo_cost.program_cost(text).flops, flops)

  def test_padded_sizes(self):
    # Tiles pad the most minor dimensions (layout order): XLA:TPU counts these sizes (checked
    # against its cost_analysis() of an elementwise program on each of these shapes).
    self.assertEqual(hlo_text.shape_bytes("f32[3,5]{1,0:T(4,128)}"), 4 * 128 * 4)
    self.assertEqual(hlo_text.shape_bytes("f32[1000,100]{0,1:T(8,128)}"), 104 * 1024 * 4)
    self.assertEqual(hlo_text.shape_bytes("s32[]{:T(128)}"), 128 * 4)
    self.assertEqual(hlo_text.shape_bytes("(s32[]{:T(128)}, bf16[16,128]{1,0:T(8,128)(2,1)S(1)})"),
                     512 + 16 * 128 * 2)
    self.assertEqual(hlo_text.shape_bytes("f32[3,5]"), 60)  # no layout: logical


# XLA:TPU's asynchronous all-gather of a bf16[128,256] shard into bf16[512,256], as two
# fusions that both hold the all-gather (same channel) around custom calls (the long
# instructions are wrapped, as HLO text wraps a kernel's metadata). By hand:
#   collective: the result once, 512*256*2 = 262144 (not twice)
#   bytes: the start reads the shard 65536 and writes the result buffer 262144; the done
#     writes the result 262144: 589824.
ASYNC_ALL_GATHER = """HloModule async_all_gather

%start (p: bf16[128,256]) -> (bf16[128,256], bf16[512,256], u32[]) {
  %p = bf16[128,256]{1,0} parameter(0)
  %gather = bf16[512,256]{1,0} all-gather(%p), channel_id=7, dimensions={0}
  ROOT %begin = (bf16[128,256]{1,0}, bf16[512,256]{1,0}, u32[]{:S(2)}) custom-call(%p,
      %gather), custom_call_target="AsyncCollectiveStart"
}

%done (q: bf16[128,256], r: bf16[512,256], f: u32[]) -> bf16[512,256] {
  %q = bf16[128,256]{1,0} parameter(0)
  %r = bf16[512,256]{1,0} parameter(1)
  %f = u32[]{:S(2)} parameter(2)
  %gather.1 = bf16[512,256]{1,0} all-gather(%q), channel_id=7, dimensions={0}
  ROOT %end = bf16[512,256]{1,0} custom-call(%q, %r,
      %gather.1, %f), custom_call_target="AsyncCollectiveDone", frontend_attributes={k={
"xprof": "{\\"a\\": [1, 2}"
}}
}

ENTRY %main (x: bf16[128,256]) -> bf16[512,256] {
  %x = bf16[128,256]{1,0} parameter(0)
  %started = (bf16[128,256]{1,0}, bf16[512,256]{1,0},
      u32[]{:S(2)}) fusion(%x), kind=kCustom, calls=%start
  %shard = bf16[128,256]{1,0} get-tuple-element(%started), index=0
  %buffer = bf16[512,256]{1,0} get-tuple-element(%started), index=1
  %flag = u32[]{:S(2)} get-tuple-element(%started), index=2
  ROOT %gathered = bf16[512,256]{1,0} fusion(%shard, %buffer, %flag), kind=kCustom, calls=%done
}
"""


class AsyncCollectiveTest(absltest.TestCase):

  def test_counted_once(self):
    cost = hlo_cost.program_cost(ASYNC_ALL_GATHER)
    self.assertEqual(cost.collective_bytes, 512 * 256 * 2)
    self.assertEqual(cost.bytes_accessed, 128 * 256 * 2 + 2 * 512 * 256 * 2)


@absltest.skipUnless(HAS_LIBTPU, "needs libtpu (the TPU compiler), pip install 'jax[tpu]'")
class CompiledTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.mesh = _mesh()

  def test_scan_counts_every_step_as_its_unrolled_program(self):
    # c += y @ w[i] for 8 layers, the carry donated (updated in place, as a training loop's).
    # (The unrolled reference's compile grows with L; every figure below is per step.)
    L, M, D = 8, 2048, 512
    w, y, c = _arg(self.mesh, (L, D, D)), _arg(self.mesh, (M, D)), _arg(self.mesh, (M, D))

    def scanned(w, y, c):
      return jax.lax.scan(lambda c, w_i: (c + y @ w_i, None), c, w)[0]

    def unrolled(w, y, c):
      for i in range(L):
        c = c + y @ w[i]
      return c

    text, xla_scanned = _compile(scanned, w, y, c, options=NO_MSA, donate_argnums=2)
    _, xla_unrolled = _compile(unrolled, w, y, c, options=NO_MSA, donate_argnums=2)
    cost = hlo_cost.program_cost(text)
    self.assertEqual([(l.trips, l.counted, l.depth) for l in cost.loops], [(L, True, 0)])
    self.assertEqual(cost.flops, L * 2 * M * D * D)
    # XLA also counts the 8 elementwise adds and their converts (0.4% here).
    self.assertAlmostEqual(cost.flops / xla_unrolled["flops"], 1, delta=0.01)
    # Negative control: XLA's own count of the scan holds one step of 8.
    self.assertAlmostEqual(xla_scanned["flops"] * L / cost.flops, 1, delta=0.01)
    # Per step: y 2 MiB + c 2 MiB + w[i] 0.5 MiB read, c 2 MiB written. The loop's own
    # bookkeeping (its s32 counter, 512 bytes padded, copied, added to, compared: ~4.8 KB a
    # step) is the 0.07% the unrolled program does not have.
    self.assertAlmostEqual(cost.bytes_accessed / xla_unrolled["bytes accessed"], 1, delta=1e-3)
    self.assertGreater(cost.bytes_accessed, xla_unrolled["bytes accessed"])

  def test_nested_loops_multiply(self):
    n = 256
    w, x = _arg(self.mesh, (4, 8, n, n)), _arg(self.mesh, (n, n))

    def nested(w, x):
      inner = lambda x, w_ij: (x @ w_ij, None)
      return jax.lax.scan(lambda x, w_i: (jax.lax.scan(inner, x, w_i)[0], None), x, w)[0]

    def unrolled(w, x):
      for i in range(4):
        for j in range(8):
          x = x @ w[i, j]
      return x

    text, _ = _compile(nested, w, x)
    _, xla_unrolled = _compile(unrolled, w, x)
    cost = hlo_cost.program_cost(text)
    self.assertEqual([(l.trips, l.counted, l.depth) for l in cost.loops],
                     [(4, True, 0), (8, True, 1)])
    self.assertEqual(cost.flops, 32 * 2 * n**3)
    self.assertEqual(cost.flops, xla_unrolled["flops"])

  def test_layer_loop_reads_one_layer_a_step(self):
    # The layer-scan pattern: a fori_loop dynamic-slices layer i out of the stacked [L, D, D]
    # weights. Counting the whole stack each step would be L times the weights' bytes.
    L, M, D = 8, 1024, 1024
    w, y, c = _arg(self.mesh, (L, D, D)), _arg(self.mesh, (M, D)), _arg(self.mesh, (M, D))

    def layers(w, y, c):
      step = lambda i, c: c + y @ jax.lax.dynamic_index_in_dim(w, i, keepdims=False)
      return jax.lax.fori_loop(0, L, step, c)

    def unrolled(w, y, c):
      for i in range(L):
        c = c + y @ w[i]
      return c

    text, _ = _compile(layers, w, y, c, options=NO_MSA, donate_argnums=2)
    _, xla_unrolled = _compile(unrolled, w, y, c, options=NO_MSA, donate_argnums=2)
    cost = hlo_cost.program_cost(text)
    self.assertEqual([(l.trips, l.counted) for l in cost.loops], [(L, True)])
    # By hand, per step: y, c and w[i] read, c written, 2 MiB each. Reading the whole stack
    # each step would add L x 7 x 2 MiB. The loop's counter (~4.8 KB a step) is the 0.06%.
    self.assertAlmostEqual(cost.bytes_accessed / (L * 4 * M * D * 2), 1, delta=1e-3)
    self.assertAlmostEqual(cost.bytes_accessed / xla_unrolled["bytes accessed"], 1, delta=1e-3)

  def test_program_without_loops_gets_xlas_figures(self):
    x, w, b = _arg(self.mesh, (1024, 512)), _arg(self.mesh, (512, 2048)), _arg(self.mesh, (2048,))
    text, xla = _compile(lambda x, w, b: jax.nn.relu(x @ w + b[None, :]), x, w, b)
    cost = hlo_cost.program_cost(text)
    self.assertEqual(cost.loops, ())
    self.assertEqual(cost.flops, 2 * 1024 * 512 * 2048)
    # XLA also counts the bias add, the relu and their converts (6 ops on each of the 2M
    # results: 0.6%).
    self.assertAlmostEqual(cost.flops / xla["flops"], 1, delta=0.01)
    self.assertLess(cost.flops, xla["flops"])
    # XLA:TPU counts a few bytes we do not: an async copy's sync flags (~4.6 KB, 0.03% here).
    self.assertAlmostEqual(cost.bytes_accessed / xla["bytes accessed"], 1, delta=1e-3)

  def test_data_dependent_loop(self):
    n = 512
    x, w = _arg(self.mesh, (n, n)), _arg(self.mesh, (n, n))

    def until_small(x, w):  # a decode-like loop: runs until its data says stop, 100 at most
      def step(c):
        x = c[1] @ w
        return c[0] + 1, x, jnp.max(jnp.abs(x)) < 1
      return jax.lax.while_loop(lambda c: (c[0] < 100) & ~c[2], step, (0, x, False))[1]

    text, xla = _compile(until_small, x, w)
    with self.assertRaisesRegex(ValueError, r"while loop '[\w.]+'.*dynamic_trips"):
      hlo_cost.program_cost(text)
    once, ten = (hlo_cost.program_cost(text, dynamic_trips=trips) for trips in (1, 10))
    self.assertEqual([(l.trips, l.counted) for l in ten.loops], [(10, False)])
    self.assertEqual(once.flops, 2 * n**3)
    self.assertEqual(ten.flops, 10 * once.flops)
    # One trip is what XLA counts; but the condition, run twice here (a few scalars), and the
    # sync flags and tuples XLA:TPU counts: 0.12%.
    self.assertAlmostEqual(once.flops / xla["flops"], 1, delta=0.01)
    self.assertAlmostEqual(once.bytes_accessed / xla["bytes accessed"], 1, delta=2e-3)

  def test_collectives(self):
    x, w = _arg(self.mesh, (1024, 512), P("d", None)), _arg(self.mesh, (512, 256))
    replicated = NamedSharding(self.mesh, P())
    # Rows sharded, the result replicated: an all-gather of the bf16[1024, 256] result.
    text, _ = _compile(lambda x, w: x @ w, x, w, out_shardings=replicated)
    self.assertIn(" all-gather(", text)
    self.assertEqual(hlo_cost.program_cost(text).collective_bytes, 1024 * 256 * 2)
    # The contraction sharded: an all-reduce of each chip's partial bf16[1024, 256].
    x, w = _arg(self.mesh, (1024, 512), P(None, "d")), _arg(self.mesh, (512, 256), P("d", None))
    text, _ = _compile(lambda x, w: x @ w, x, w, out_shardings=replicated)
    self.assertIn(" all-reduce(", text)
    self.assertEqual(hlo_cost.program_cost(text).collective_bytes, 1024 * 256 * 2)

  def test_conditional_counts_its_costliest_branch(self):
    x, w = _arg(self.mesh, (512, 512)), _arg(self.mesh, (512, 512))
    p = jax.ShapeDtypeStruct((), jnp.bool_, sharding=NamedSharding(self.mesh, P()))
    text, _ = _compile(lambda p, x, w: jax.lax.cond(p, lambda: (x @ w) @ w, lambda: x @ w),
                       p, x, w)
    self.assertIn(" conditional(", text)
    self.assertEqual(hlo_cost.program_cost(text).flops, 2 * 2 * 512**3)

  def test_kernel_estimate_counted_at_its_share(self):
    # megablox's gmm estimates 2 * rows * K * M FLOPs for its whole buffer; under expert
    # parallelism a chip's experts get only a share of the rows (analysis passes E / ep).
    A, K, M, E = 1024, 256, 512, 4
    chip = Mesh(self.mesh.devices[:1], ("d",))  # a Pallas kernel is not partitioned
    lhs, rhs = _arg(chip, (A, K)), _arg(chip, (E, K, M))
    sizes = jax.ShapeDtypeStruct((E,), jnp.int32, sharding=NamedSharding(chip, P()))
    text, _ = _compile(lambda l, r, s: moe.grouped_matmul(l, r, s, "gmm"), lhs, rhs, sizes)
    whole = hlo_cost.program_cost(text)
    quarter = hlo_cost.program_cost(text, kernel_shares={"gmm": 0.25, "other": 0.5})
    self.assertEqual(whole.flops, 2 * A * K * M)
    self.assertEqual(quarter.flops, whole.flops / 4)
    # The kernel's estimated bytes (its operands, re-read per tile, at least) scale with it;
    # the padding and slicing around it do not.
    kernel_bytes = (whole.bytes_accessed - quarter.bytes_accessed) / 0.75
    self.assertGreater(kernel_bytes, 2 * (A * K + E * K * M + A * M))
    self.assertLess(kernel_bytes, whole.bytes_accessed)
    self.assertEqual(hlo_cost.program_cost(text, kernel_shares={"tgmm": 0.25}).flops, whole.flops)


if __name__ == "__main__":
  absltest.main()
