"""Parallelism on JAX's own SPMD over a `("runs", "data")` mesh: a run group's runs split over the first axis,
each run's batches over the second, parameters replicated within a run.

`make_mesh(devices, runs)` lays the devices out as runs x data; `runs_axis_size` picks the layout a group's sizes
fit (as many run shards as divide both the run count and the device count, the rest of the devices splitting the
batch), so one run gets pure data parallelism and a group of eight on eight devices one run per device. The same
training code runs on 1 device, on N devices of one host and on many hosts:

- device-resident replay (the default on one host): the replay is replicated over the mesh, the group's states split
  along their run axis over the `runs` shards (`shard_runs`; one shard: replicated), and each gathered batch is
  constrained to split along its first axis over the `data` devices, so XLA runs the per-example work on every
  device and all-reduces the gradients within a run's shard. With one device nothing is placed or constrained.
- host-fed replay (embeddings on disk, or more than one process): every process owns one contiguous slice of the
  transitions (`replay_slice`), gathers its rows of each batch on the host and hands them to
  `jax.make_array_from_process_local_data`, which assembles the global batch sharded over all devices.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

RUNS, DATA = "runs", "data"


def on_device(x, dtype=None) -> jax.Array:
    """`jnp.asarray(x, dtype)` of a host array (a copy, uncommitted, in JAX's default dtype for it: int64 -> int32
    where x64 is off) without an XLA program: `jnp.asarray` compiles a small one per shape and dtype, each waiting
    behind any compile under way in another thread (`engine.ProgramsAhead`: 0.7 s of RouteSim's calibrate for the
    corpus's dozen arrays); `device_put` converts on the host."""
    if isinstance(x, jax.Array) and (dtype is None or x.dtype == dtype):
        return x   # as jnp.asarray: an array already there is kept (a run group's corpora share one table)
    return jax.device_put(np.asarray(x, dtype))


def mesh_devices(num_devices: int = 0) -> list:
    """The first `num_devices` devices (0 = all of them, on every host)."""
    devices = jax.devices()
    if num_devices < 0 or num_devices > len(devices):
        raise ValueError(f"asked for {num_devices} devices; {len(devices)} are visible ({jax.default_backend()})")
    if jax.process_count() > 1 and num_devices not in (0, len(devices)):
        raise ValueError(f"a multi-host run trains on every device of every host: set config.devices=0 "
                         f"(it is {num_devices}; {len(devices)} devices on {jax.process_count()} hosts)")
    return devices[:num_devices or len(devices)]


def runs_axis_size(num_runs: int, num_devices: int) -> int:
    """How many shards a group of `num_runs` runs splits into over `num_devices` devices: the largest count that
    divides both (runs are never padded), so the rest of the devices split every run's batches."""
    return math.gcd(num_runs, num_devices)


def make_mesh(num_devices: int = 0, runs: int = 1) -> Mesh:
    """A (runs, data) mesh over the first `num_devices` devices (0 = all of them): `runs` run shards, each over
    num_devices / runs devices that split the batch."""
    devices = mesh_devices(num_devices)
    if len(devices) % runs:
        raise ValueError(f"{runs} run shards do not divide {len(devices)} devices")
    return Mesh(np.array(devices).reshape(runs, len(devices) // runs), (RUNS, DATA))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def replicate(tree, mesh: Mesh):
    """Every leaf copied to every device of the mesh (on every host: each process passes the same values)."""
    sharding = replicated(mesh)
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def place(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed keys travel as their raw key data
            return jax.random.wrap_key_data(place(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x  # already in place (restored onto the mesh by orbax)
        value = np.asarray(x)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree.map(place, tree)


def shard_runs(tree, mesh: Mesh):
    """Every leaf (R, ...) split along its leading run axis over the mesh's `runs` axis (one process)."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec(RUNS)))


def shard_batch(batch, mesh: Mesh):
    """Inside jit: split every array of a batch along its first (example) axis over the mesh."""
    sharding = NamedSharding(mesh, PartitionSpec(DATA))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), batch)


def global_batches(local, mesh: Mesh, batch_axis: int = 1):
    """Host arrays (..., K, b, ...) of this process's rows -> global arrays (..., K, b * processes, ...) split over
    the mesh along the batch axis (`batch_axis`; the axes before it, e.g. runs and the scan over K steps, are
    whole on every device)."""
    sharding = NamedSharding(mesh, PartitionSpec(*(None,) * batch_axis, DATA))
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local)


def replay_slice(num_transitions: int, num_slices: int | None = None, index: int | None = None) -> slice:
    """The contiguous transitions process `index` of `num_slices` reads (default: this process of all)."""
    num_slices = jax.process_count() if num_slices is None else num_slices
    index = jax.process_index() if index is None else index
    return slice(index * num_transitions // num_slices, (index + 1) * num_transitions // num_slices)


def check_divisible(batch_size: int, mesh: Mesh) -> None:
    split = mesh.shape[DATA]
    if batch_size % split:
        raise ValueError(f"batch size {batch_size} does not split over {split} devices: use a multiple of "
                         f"{split} (config.optim.batch_size) or fewer devices (config.devices)")


def epoch_batches(key: jax.Array, num_transitions: int, batch_size: int, num_slices: int = 1,
                  slice_index: int = 0) -> jax.Array:
    """A fresh shuffle of one replay slice cut into full batches: (num_batches, batch_size // num_slices) indices.

    Slice `slice_index` of `num_slices` (one per host; see `replay_slice`) contributes its share of every
    global batch, drawn from its own transitions only. Every slice takes the same number of batches (that of the
    smallest slice); the remainder is dropped this epoch and lands elsewhere in the next shuffle; a slice smaller
    than its share of one batch is repeated to fill it.
    """
    rows = replay_slice(num_transitions, num_slices, slice_index)
    local_batch, smallest = batch_size // num_slices, num_transitions // num_slices
    perm = rows.start + jax.random.permutation(jax.random.fold_in(key, slice_index), rows.stop - rows.start)
    if perm.shape[0] < local_batch:
        perm = jnp.resize(perm, (local_batch,))
    num_batches = max(smallest // local_batch, 1)
    return perm[: num_batches * local_batch].reshape(num_batches, local_batch)
