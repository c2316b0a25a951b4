"""Helpers the test files share (fixtures that build something are in conftest.py)."""

import contextlib
import dataclasses
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from absl import app, flags
from absl import logging as absl_logging

from configs import default
from rivet_jax import train
from rivet_jax.settings import with_overrides

REPO = Path(__file__).resolve().parents[1]


class SimulatedKill(Exception):
    """Raised from a progress hook to stop a run the way a kill would, between two saves."""


def tiny_config(**overrides):
    """configs/default.py:tiny on the RouteSim demo corpus, with dotted-key overrides."""
    return with_overrides(default.get_config("tiny"), {"data.demo": True, **overrides})


def run_stage(config, workdir, stage, **kwargs):
    """One stage of `config`'s run in `workdir` (`train.train` with config.stage = stage)."""
    return train.train(with_overrides(config, {"stage": stage}), workdir, **kwargs)


@dataclasses.dataclass
class Launched:
    """What a launcher run left: its exit status and what it wrote (as `subprocess.CompletedProcess` names them)."""

    returncode: int
    stdout: str
    stderr: str


def run_launcher(capfd, name: str, *args: str) -> Launched:
    """`python -m launch.<name> ARGS`, run in this process: no interpreter or JAX start of its own. The launcher's
    flags are parsed as its `__main__` parses them (`run_app` when it has a --config, else `app.run`), its exit status
    is its SystemExit, and every flag it defined (its own, and the --config.KEY overrides that parsing adds) is
    removed afterwards so the next launcher can define its own. For launchers that leave no global state behind (no
    compilation cache): a real process is kept where it is the point (kills, several hosts, a workdir held by
    another process) and for the long experiments."""
    from launch.common import run_app

    argv = [f"launch/{name}.py", *args]
    saved_argv, sys.argv = sys.argv, argv  # ml_collections reads --config.KEY overrides from the command line
    defined = set(flags.FLAGS)
    module = importlib.import_module(f"launch.{name}")
    own = set(flags.FLAGS) - defined
    capfd.readouterr()  # what came before is not this run's
    handler = absl_logging.get_absl_handler().python_handler
    saved_stream = handler.stream
    handler.stream = sys.stderr  # absl's log lines go where a process's would (the handler kept pytest's first)
    try:
        run_app(module.main, argv) if "config" in own else app.run(module.main, argv=argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.argv, handler.stream = saved_argv, saved_stream
        for flag in set(flags.FLAGS) - defined:  # the launcher's own, and the --config.KEY overrides parsing added
            delattr(flags.FLAGS, flag)
        sys.modules.pop(f"launch.{name}", None)
    out, err = capfd.readouterr()
    return Launched(code, out, err)


def cpu_env(devices: int) -> dict:
    """A subprocess environment with `devices` simulated CPU devices (never leaking into this process)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}


def run_on_eight_devices(script: str, *args) -> str:
    """Runs `script` (`python -c`, its arguments `args`) on 8 simulated CPU devices; it must print "ok"."""
    result = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=REPO, env=cpu_env(8),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ok" in result.stdout
    return result.stdout


# An 8-device script's prologue: it records the sharding of the stacked states each offline group trained with.
RECORD_LAYOUTS = textwrap.dedent("""
    from rivet_jax import engine
    LAYOUTS = []
    _train_together = engine.train_together

    def recording(runs, on_epoch_end=None, ahead=None):
        states = _train_together(runs, on_epoch_end, ahead)
        leaf = jax.tree.leaves(states.params)[0]
        spec = tuple(getattr(leaf.sharding, "spec", ()))  # a 1-device run has no mesh
        LAYOUTS.append((len(runs), runs[0].config.devices, spec, len(leaf.sharding.device_set)))
        return states

    engine.train_together = recording


    def worst(a, b):
        return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a),
                                                                                          jax.tree.leaves(b)))
""")



@contextlib.contextmanager
def upstream_servers(make_app, names):
    """One local upstream per model name, serving `make_app(name, modes[name])`; yields (servers, modes), `modes[name]`
    a dict the test changes to switch that upstream's behaviour."""
    from rivet_jax.serve.fake import ServerThread  # deferred: uvicorn only for the proxy's tests

    modes = {name: {} for name in names}
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(ServerThread(make_app(name, modes[name]))) for name in names}, modes
