"""Data parallelism: the same tiny training on 8 simulated CPU devices and on 1 reaches the same parameters, and a
checkpoint saved on 8 devices restores (and routes) on 1. Runs in a subprocess so that the forced device count
never leaks into the rest of the suite."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    from configs import default
    from rivet_jax import train
    from rivet_jax.pipelines import with_overrides
    from rivet_jax.router import Router

    assert len(jax.devices()) == 8, jax.devices()
    workdir = sys.argv[1]
    states = {}
    for devices in (8, 1):
        config = with_overrides(default.get_config("tiny"), {"devices": devices, "stage": "offline"})
        states[devices] = train.train(config, f"{workdir}/d{devices}")
    leaves = [jax.tree.leaves(states[d].params) for d in (8, 1)]
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(*leaves))
    print("max abs difference", worst)
    assert worst < 1e-4, worst
    sharded = jax.tree.leaves(states[8].params)[0].sharding
    assert len(sharded.device_set) == 8, sharded  # the 8-device run really used 8 devices
    with jax.default_device(jax.devices()[0]):
        router = Router.from_checkpoint(f"{workdir}/d8")  # saved from 8 devices, restored as plain arrays
        decision = router.route("Task: add 2 and 3", [])
    assert decision.model in router.pool.names
    print("ok")
""")


@pytest.mark.slow
def test_eight_devices_match_one_and_checkpoints_move_between_them(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ok" in result.stdout
