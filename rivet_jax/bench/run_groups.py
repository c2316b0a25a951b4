"""The reproduction's training throughput: many runs as one program (`rivet_jax.engine`) against one solo run,
with the runs vmapped into every step and with each run through its own one-run program (side by side on a CPU's
cores, `engine.in_threads`)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rivet_jax import engine
from rivet_jax.learner import run_values, stack, template_state
from rivet_jax.settings import LossWeights

REPEATS = 3


def _block(tree):
    return jax.block_until_ready(tree)


def run_group_throughput(config, net, tx, data, pool, runs: int, solo_steps_per_s: float | None) -> dict:
    """TD+CQL epochs of `runs` runs (each its own seed) as one program (`engine`), warm, against one solo run's
    scanned epoch: the reproduction's training throughput, with every run vmapped into each step and with each run
    through its own one-run program, side by side on one device (the CPU default, `learner.runs_vmapped`)."""
    result = {"runs": runs}
    for name, vmapped in (("vmapped", 0), ("per_run", 1)):
        configs = [ml_collections.ConfigDict({**config.to_dict(), "seed": config.seed + r, "runs_vmapped": vmapped})
                   for r in range(runs)]
        states = stack([template_state(c.seed, net, tx, data.embeddings.shape[1], pool, "td") for c in configs])
        values = run_values([LossWeights.of(c) for c in configs], [data.replay] * runs)
        group_epoch = engine.make_group_epoch(net, tx, configs[0], "td")
        started = time.perf_counter()
        states, metrics, _ = _block(group_epoch(states, data, values, jnp.int32(0)))
        first_epoch = time.perf_counter() - started
        steps = int(metrics["loss"].shape[1])                                      # metrics (R, S)
        seconds = []
        for epoch in range(1, 1 + REPEATS):
            started = time.perf_counter()
            states, metrics, _ = _block(group_epoch(states, data, values, jnp.int32(epoch)))
            seconds.append(time.perf_counter() - started)
        run_steps = runs * steps / float(np.median(seconds))
        result[name] = {"steps_per_epoch": steps, "first_epoch_s": first_epoch, "run_steps_per_s": run_steps,
                        "over_solo": run_steps / solo_steps_per_s if solo_steps_per_s else None}
    return result


def run_group_rows(group: dict) -> list[tuple[str, str, str]]:
    """The benchmark table's rows for `run_group_throughput`'s result."""
    label = {"vmapped": "vmapped", "per_run": "side by side"}
    return [(f"reproduction training: {group['runs']} runs {label[how]}",
             f"{group[how]['run_steps_per_s']:.0f} run-steps/s",
             f"TD+CQL epochs of {group['runs']} seeds as one program (engine.py): "
             f"{group[how]['over_solo'] or float('nan'):.2f}x one solo run's scanned steps/s; first epoch (with "
             f"compile) {group[how]['first_epoch_s']:.1f}s") for how in ("vmapped", "per_run")]
