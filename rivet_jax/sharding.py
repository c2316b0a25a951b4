"""Data parallelism on JAX's own SPMD: one `("data",)` mesh axis, parameters replicated, batches sharded.

The same training code runs on 1 device and on N: with a mesh of N > 1 devices the train state and the replay are
replicated over it and each gathered batch is constrained to be split along its first axis, so XLA runs the
per-example work on every device and all-reduces the gradients. With one device nothing is placed or constrained.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA = "data"


def make_mesh(num_devices: int = 0) -> Mesh:
    """A 1-D mesh over the first `num_devices` devices (0 = all of them)."""
    devices = jax.devices()
    if num_devices < 0 or num_devices > len(devices):
        raise ValueError(f"asked for {num_devices} devices; {len(devices)} are visible ({jax.default_backend()})")
    return Mesh(np.array(devices[:num_devices or len(devices)]), (DATA,))


def replicate(tree, mesh: Mesh):
    """Every leaf copied to every device of the mesh."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def shard_batch(batch, mesh: Mesh):
    """Inside jit: split every array of a batch along its first (example) axis over the mesh."""
    sharding = NamedSharding(mesh, PartitionSpec(DATA))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), batch)


def check_divisible(batch_size: int, mesh: Mesh) -> None:
    if batch_size % mesh.size:
        raise ValueError(f"batch size {batch_size} does not split over {mesh.size} devices: use a multiple of "
                         f"{mesh.size} (config.optim.batch_size) or fewer devices (config.devices)")
