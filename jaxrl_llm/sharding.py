"""The one device mesh, the logical-axis vocabulary, and rules -> NamedSharding.

Every array that lives on devices (policy, reference and value parameters, optimizer
state, KV caches, batches) names its dimensions with the logical axes below. A table of
rules (`config.mesh.rules`) maps each logical axis to zero, one or several mesh axes
(`data`, `fsdp`, `expert`, `context`, `tensor`). A mesh axis shards an array's dimension
only where it divides it, and at most once per array. A parameter dimension that the rules
put on a mesh axis that does not divide it stays replicated over that axis, and the set-up
says so once per parameter and axis (a warning naming both): the run is correct, but that
parameter's memory is not split as the rules ask (tiny test models with odd sizes).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Logical axis names, defined once.
BATCH = "batch"
SEQ = "seq"
EMBED = "embed"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
VOCAB = "vocab"
CACHE_SEQ = "cache_seq"
LAYERS = "layers"
EXPERT = "expert"  # the experts of an MoE layer (`models.moe`)
LOGICAL_AXES = (BATCH, SEQ, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB, CACHE_SEQ, LAYERS, EXPERT)

MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")
# A mesh config may leave these out (size 1): configs and tests written before the axis.
_OPTIONAL_MESH_AXES = ("expert", "context")

# Batch over data, fsdp and expert; parameters gathered over fsdp; experts over expert
# (expert parallelism: outside the MoE layers the expert axis is one more data axis); the
# sequence of the activations over context (context parallelism: each device holds a slice
# of every row's tokens, and the SPMD partitioner gathers a layer's keys and values for its
# queries); heads, MLP and vocab over tensor.
DEFAULT_RULES = (
    (BATCH, ("data", "fsdp", "expert")),
    (EMBED, "fsdp"),
    (HEADS, "tensor"),
    (KV_HEADS, "tensor"),
    (MLP, "tensor"),
    (VOCAB, "tensor"),
    (HEAD_DIM, None),
    (SEQ, "context"),
    (CACHE_SEQ, None),
    (LAYERS, None),
    (EXPERT, "expert"),
)

Rules = Sequence[tuple[str, Any]]


def freeze_rules(rules: Rules | None) -> tuple | None:
  """Rules as nested tuples (hashable, so a `Model` holding them can be a jit static)."""
  return None if rules is None else tuple(
      (name, tuple(axes) if isinstance(axes, (list, tuple)) else axes) for name, axes in rules)


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (data, fsdp, expert, context, tensor) mesh from `config.mesh`.

  Args:
    mesh_cfg: anything with integer attributes (or keys) `data`, `fsdp`, `tensor` and
      optionally `expert` and `context` (absent: 1); one of them may be -1, meaning "all the
      devices the others leave".
    devices: defaults to all devices of all processes.
  Returns:
    A `jax.sharding.Mesh` with axis names MESH_AXES.
  """
  devices = list(jax.devices() if devices is None else devices)
  get = mesh_cfg.get if isinstance(mesh_cfg, dict) else lambda k: getattr(mesh_cfg, k)
  has = (lambda k: k in mesh_cfg) if isinstance(mesh_cfg, dict) else lambda k: hasattr(mesh_cfg, k)
  shape = {axis: int(get(axis)) if has(axis) or axis not in _OPTIONAL_MESH_AXES else 1
           for axis in MESH_AXES}
  for axis, size in shape.items():
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{axis}={size}: expected a positive size or -1")
  rest = [a for a, s in shape.items() if s == -1]
  if len(rest) > 1:
    raise ValueError(f"config.mesh: only one axis may be -1, got {rest}")
  known = math.prod(s for s in shape.values() if s != -1)
  sizes = ", ".join(f"{a}={s}" for a, s in shape.items())
  if rest:
    if len(devices) % known:
      raise ValueError(f"config.mesh ({sizes}): the other axes ({known} devices) do not divide "
                       f"the {len(devices)} devices; expected sizes whose product divides "
                       f"{len(devices)}")
    shape[rest[0]] = len(devices) // known
  if math.prod(shape.values()) != len(devices):
    raise ValueError(f"config.mesh ({sizes}) needs {math.prod(shape.values())} devices; there "
                     f"are {len(devices)}: expected sizes whose product is {len(devices)} "
                     "(or one axis -1 for the rest)")
  dims = tuple(shape[a] for a in MESH_AXES)
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  if slices > 1:
    return Mesh(_multislice_devices(dims, devices, slices, sizes), MESH_AXES)
  try:
    device_array = mesh_utils.create_device_mesh(dims, devices)
  except (ValueError, AssertionError, NotImplementedError):
    device_array = np.asarray(devices).reshape(dims)
  return Mesh(device_array, MESH_AXES)


def _multislice_devices(dims: tuple[int, ...], devices, slices: int, sizes: str) -> np.ndarray:
  """Devices of several TPU slices (multislice) in mesh order: the data axis spans the
  slices, which talk over the data-center network (DCN); every other axis stays within a
  slice, on its inter-chip links (MaxText's dcn_data_parallelism)."""
  if dims[0] % slices:
    raise ValueError(f"config.mesh ({sizes}) over {slices} slices: the data axis spans the "
                     f"slices, so expected data a multiple of {slices}")
  per_slice = (dims[0] // slices,) + dims[1:]
  return mesh_utils.create_hybrid_device_mesh(per_slice, (slices,) + (1,) * (len(dims) - 1),
                                              devices)


def split_meshes(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> tuple[Mesh, Mesh | None]:
  """(trainer mesh, rollout mesh) from `config.mesh`.

  `mesh_cfg.rollout_devices = n > 0` gives the sampler n devices of its own and builds the
  trainer's mesh (`make_mesh`) over the rest; n = 0 gives one mesh over every device and no
  rollout mesh. With one process the sampler's mesh is the first n devices, tensor-parallel
  (tensor = n, every other axis 1). With several, every process gives
  the sampler its first n / process_count devices, and the sampler's mesh is data-parallel
  over the processes (data = process_count, tensor = n / process_count): each process's
  prompts are sampled, and their rows scored, on its own devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = int(mesh_cfg.rollout_devices)
  if n == 0:
    return make_mesh(mesh_cfg, devices), None
  if n > 0 and len(devices) < 2:
    raise ValueError(f"config.mesh.rollout_devices={n} gives the sampler devices of its own, "
                     f"which needs at least 2 devices; there is {len(devices)}: expected 0 (on a "
                     "CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N devices)")
  if not 0 < n < len(devices):
    raise ValueError(f"config.mesh.rollout_devices={n}: expected 0 (shared placement) or 1 to "
                     f"{len(devices) - 1}, leaving the trainer at least one of the "
                     f"{len(devices)} devices")
  processes = sorted({d.process_index for d in devices})
  if n % len(processes):
    raise ValueError(f"config.mesh.rollout_devices={n} over {len(processes)} processes: "
                     f"expected a multiple of {len(processes)} (every process gives the sampler "
                     "as many devices of its own)")
  per = n // len(processes)
  own = [[d for d in devices if d.process_index == p] for p in processes]
  if min(len(o) for o in own) <= per:
    raise ValueError(f"config.mesh.rollout_devices={n}: each of the {len(processes)} processes "
                     f"gives the sampler {per} of its {min(len(o) for o in own)} devices, leaving "
                     "the trainer none there; expected fewer")
  sampler = [d for o in own for d in o[:per]]
  shape = (len(processes),) + (1,) * (len(MESH_AXES) - 2) + (per,)  # data, ..., tensor
  rollout = Mesh(np.asarray(sampler).reshape(shape), MESH_AXES)
  return make_mesh(mesh_cfg, [d for d in devices if d not in sampler]), rollout


def _rules_table(rules: Rules) -> dict[str, tuple[str, ...]]:
  table = {}
  for logical, mesh_axes in rules:
    if logical not in LOGICAL_AXES:
      raise ValueError(f"config.mesh.rules: unknown logical axis {logical!r}; "
                       f"expected one of {list(LOGICAL_AXES)}")
    if mesh_axes is None:
      mesh_axes = ()
    elif isinstance(mesh_axes, str):
      mesh_axes = (mesh_axes,)
    for axis in mesh_axes:
      if axis not in MESH_AXES:
        raise ValueError(f"config.mesh.rules: {logical!r} maps to unknown mesh axis {axis!r}; "
                         f"expected some of {list(MESH_AXES)}")
    table[logical] = tuple(mesh_axes)
  return table


_WARNED: set[tuple[str, str]] = set()  # (array, mesh axis) pairs already reported


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Rules, *, what: str | None = None) -> PartitionSpec:
  """PartitionSpec for one array: each dimension's logical name through the rules.

  A mesh axis is used at most once per array, and only where it divides the dimension;
  otherwise that dimension is replicated over it, with a warning (once) when `what`
  names the array (a parameter).
  """
  if len(names) != len(shape):
    raise ValueError(f"logical axes {tuple(names)} do not match an array of shape {tuple(shape)}")
  table = _rules_table(rules)
  used: set[str] = set()
  spec = []
  for name, size in zip(names, shape):
    chosen = []
    for axis in table.get(name, ()) if name is not None else ():
      n = mesh.shape[axis]
      if axis in used or n == 1:
        continue
      if size % (math.prod(mesh.shape[a] for a in chosen) * n):
        if what is not None and (what, axis) not in _WARNED:
          _WARNED.add((what, axis))
          logging.warning("%s: its '%s' dimension (%d) does not divide over mesh axis '%s' (%d "
                          "devices): replicated over '%s' instead of sharded as "
                          "config.mesh.rules asks", what, name, size, axis,
                          math.prod(mesh.shape[a] for a in chosen) * n, axis)
        continue
      chosen.append(axis)
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return PartitionSpec(*spec)


def named_sharding(names, shape, mesh: Mesh, rules: Rules, *,
                   what: str | None = None) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(names, shape, mesh, rules, what=what))


def constrain(x: jax.Array, names: Sequence[str | None], mesh: Mesh | None, rules: Rules | None):
  """`with_sharding_constraint` by logical names; a no-op without a mesh."""
  if mesh is None or rules is None:
    return x
  return jax.lax.with_sharding_constraint(x, named_sharding(names, x.shape, mesh, rules))


def _is_partitioned(x) -> bool:
  return isinstance(x, nn.Partitioned)


def infer_shardings(abstract_tree, mesh: Mesh, rules: Rules):
  """NamedShardings for a tree whose leaves are `nn.Partitioned` (boxed) or plain arrays.

  Boxed leaves carry their logical names; plain leaves (scalars, counters) are replicated.
  A dimension a rule cannot shard is reported by the leaf's path (`logical_to_spec`).
  """
  def one(path, leaf):
    if _is_partitioned(leaf):
      return named_sharding(leaf.names, leaf.value.shape, mesh, rules,
                            what="parameter " + jax.tree_util.keystr(path, simple=True,
                                                                     separator="/"))
    return NamedSharding(mesh, PartitionSpec())
  return jax.tree_util.tree_map_with_path(one, abstract_tree, is_leaf=_is_partitioned)


def init_sharded(init_fn: Callable[[], Any], mesh: Mesh, rules: Rules):
  """Runs `init_fn` (returning a boxed tree) jitted, so its outputs are born sharded.

  Returns:
    (unboxed params placed on `mesh`, their NamedShardings).
  """
  abstract = jax.eval_shape(init_fn)
  shardings = nn.unbox(infer_shardings(abstract, mesh, rules))
  params = jax.jit(lambda: nn.unbox(init_fn()), out_shardings=shardings)()
  return params, shardings


def put(tree, shardings):
  """Places host (numpy) arrays on the mesh; works with several processes.

  Every process holds the whole host value; each one hands its devices their slices.
  Arrays that are already global (of several processes) are copied (`transfer`).
  """
  leaves, treedef = jax.tree.flatten(tree)
  targets = treedef.flatten_up_to(shardings)
  spread = [i for i, x in enumerate(leaves)
            if isinstance(x, jax.Array) and not x.is_fully_addressable]
  moved = dict(zip(spread, transfer([leaves[i] for i in spread], [targets[i] for i in spread])))

  def one(i, x, sharding):
    if i in moved:
      return moved[i]
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
  return treedef.unflatten([one(i, x, t) for i, (x, t) in enumerate(zip(leaves, targets))])


def transfer(tree, shardings):
  """Copies arrays (a pytree) onto other shardings, another mesh's included; never aliases.

  Within one process (or between shardings of the same devices) this is `jax.device_put`.
  Between meshes of different devices spanning processes, which XLA copies directly only on
  TPU's runtime, every array is first spread whole over each process's own source devices
  (`staging_shardings`: one copy per process, split over its devices along the array's
  largest dimension they divide; one program for the tree, its collectives moving only the
  shards each process lacks), then each process copies the pieces of the target it holds
  from its devices' shards onto its own target devices.
  """
  leaves, treedef = jax.tree.flatten(tree)
  targets = treedef.flatten_up_to(shardings)

  def direct(x, sharding):
    return (not isinstance(x, jax.Array) or x.is_fully_addressable and sharding.is_fully_addressable
            or x.sharding.device_set == sharding.device_set)
  out = [jax.device_put(x, s, may_alias=False) if direct(x, s) else None
         for x, s in zip(leaves, targets)]
  staged = [i for i, o in enumerate(out) if o is None]
  by_devices = {}  # one staging program per set of source devices
  for i in staged:
    by_devices.setdefault(frozenset(leaves[i].sharding.device_set), []).append(i)
  for group in by_devices.values():
    xs = [leaves[i] for i in group]
    spread = _staging_program(tuple(staging_shardings(xs)))(xs)
    for i, x in zip(group, spread):
      out[i] = _from_this_process_copy(_this_process_copy(x), targets[i])
  return treedef.unflatten(out)


def staging_shardings(xs: Sequence[jax.Array]) -> list[NamedSharding]:
  """Where `transfer` stages arrays of one set of devices spanning processes: replicated
  over the processes and, within each, split over that process's devices along the array's
  largest dimension their count divides (whole on each device where none does, and when
  processes hold unequal numbers of the devices)."""
  devices = sorted(xs[0].sharding.device_set, key=lambda d: (d.process_index, d.id))
  processes = sorted({d.process_index for d in devices})
  per = len(devices) // len(processes)
  if any(sum(d.process_index == p for d in devices) != per for p in processes):
    per = 1
    mesh = Mesh(np.asarray(devices), ("devices",))
  else:
    mesh = Mesh(np.asarray(devices).reshape(len(processes), per), ("processes", "local"))

  def one(x):
    dims = [d for d in range(x.ndim) if per > 1 and x.shape[d] % per == 0]
    if not dims:
      return NamedSharding(mesh, PartitionSpec())
    dim = max(dims, key=lambda d: x.shape[d])
    return NamedSharding(mesh, PartitionSpec(*([None] * dim), "local"))
  return [one(x) for x in xs]


@functools.cache
def _staging_program(shardings: tuple):
  """The program that places a list of arrays on `shardings` (one per array), compiled once
  per list of shardings and shapes."""
  return jax.jit(lambda xs: xs, out_shardings=list(shardings))


def _from_this_process_copy(local: jax.Array, target: NamedSharding) -> jax.Array:
  """The global array on `target` whose pieces on this process's devices come from `local`
  (this process's whole copy): one `device_put` where the target is this process's alone or
  its devices of the target mesh form a block that holds the same pieces (a mesh replicated
  over the processes, as the sampler's), else a slice per device."""
  if target.is_fully_addressable:  # this process's devices alone (e.g. one device)
    return jax.device_put(local, target, may_alias=False)
  wanted = target.addressable_devices_indices_map(local.shape)
  mine = np.vectorize(lambda d: d.process_index == jax.process_index())(target.mesh.devices)
  corner, end = np.argwhere(mine).min(0), np.argwhere(mine).max(0) + 1
  block = target.mesh.devices[tuple(slice(a, b) for a, b in zip(corner, end))]
  if block.size == len(wanted):
    here = NamedSharding(Mesh(block, target.mesh.axis_names), target.spec)
    if here.devices_indices_map(local.shape) == wanted:
      pieces = jax.device_put(local, here, may_alias=False).addressable_shards
      return jax.make_array_from_single_device_arrays(local.shape, target,
                                                      [s.data for s in pieces])
  pieces = [jax.device_put(local[index], device) for device, index in wanted.items()]
  return jax.make_array_from_single_device_arrays(local.shape, target, pieces)


def _this_process_copy(x: jax.Array) -> jax.Array:
  """This process's shards of an array staged by `transfer` (each process holds it whole)
  as an array of this process alone, so it can be sliced without the other processes."""
  shards = sorted(x.addressable_shards, key=lambda s: s.device.id)
  spec = x.sharding.spec if x.sharding.mesh.axis_names == ("processes", "local") else None
  if spec is None or all(s.index == shards[0].index for s in shards):
    return shards[0].data  # whole on each of this process's devices
  local = Mesh(np.asarray([s.device for s in shards]), ("local",))
  return jax.make_array_from_single_device_arrays(
      x.shape, NamedSharding(local, spec), [s.data for s in shards])


def put_process_rows(x, names: tuple, mesh: Mesh, rules: Rules) -> jax.Array:
  """This process's rows of a batch (host array) -> the global array of every process's.

  Process p's n rows become rows [p * n, (p + 1) * n) of the global array, sharded by the
  logical axis `names` (the batch axis first). With one process: the whole array, placed.
  """
  x = np.asarray(x)
  global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
  sharding = named_sharding(names, global_shape, mesh, rules)
  return jax.make_array_from_process_local_data(sharding, x, global_shape)


def seq_shards(mesh: Mesh | None, rules: Rules | None) -> int:
  """How many pieces the 'seq' rule cuts an activation's sequence into on `mesh` (1 without
  one): a sequence of a multiple of it is split over every one of those devices
  (context parallelism), any other length stays whole on each (`logical_to_spec`)."""
  if mesh is None or rules is None:
    return 1
  return math.prod(mesh.shape[a] for a in _rules_table(rules).get(SEQ, ()))


def sampling_rules(mesh: Mesh | None, rules: Rules | None):
  """The rules the sampler's programs run under: `rules` with the devices that split the
  sequence (the 'seq' rule's, context parallelism) taking rows of their own instead. A
  decode step feeds one token per row, with nothing to split, so under the training rules
  those devices would all decode the same rows; `rules` itself when they are one device."""
  if seq_shards(mesh, rules) == 1:
    return rules
  table = _rules_table(rules)
  rows = table.get(BATCH, ()) + tuple(a for a in table[SEQ] if a not in table.get(BATCH, ()))
  return freeze_rules([(name, rows if name == BATCH else None if name == SEQ else axes)
                       for name, axes in rules])


def rows_sharding(rows: int, mesh: Mesh, rules: Rules) -> NamedSharding:
  """A batch of `rows` rows split over the mesh's batch axes, the other dims replicated.

  A prefix for a whole dict of batch arrays of any ranks (jit's in/out_shardings): every
  array's first axis is its rows.
  """
  return named_sharding((BATCH,), (rows,), mesh, rules)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
