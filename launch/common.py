"""What every launcher shares: the errors that describe the user's input, reported as one line; joining a
multi-host run."""

from __future__ import annotations

import difflib
import errno
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

import jax

from absl import app, flags, logging

from rivet_jax import checkpointing, heap
from rivet_jax.config_checks import ConfigError, check_config
from rivet_jax.run_identity import flatten
from rivet_jax import settings
from rivet_jax.corpus import NoCorpusError
from rivet_jax.data.schema import DataError
from rivet_jax.workdir_lock import WorkdirBusyError

# Errors about the user's data, workdir or checkpoints: one clear line and exit status 1, not a traceback.
USER_ERRORS = (DataError, checkpointing.CheckpointMismatchError, checkpointing.NonFiniteError, NoCorpusError,
               FileNotFoundError, ConfigError, checkpointing.ConfigChangedError, checkpointing.DamagedCheckpointError,
               WorkdirBusyError)
_USER_OS_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
_HELP = ("-h", "-help", "--help", "-?", "--helpshort", "--helpfull")


def run_reporting_user_errors(job: Callable[[], object], config=None) -> object:
    """Runs `job` with orbax's INFO chatter hidden; a user error ends the process with its message. `config` (the
    launcher's) is checked first, before any compute."""
    checkpointing.quiet_orbax_logs()
    try:
        if config is not None:
            check_config(config)
        return job()
    except USER_ERRORS as error:
        logging.error("%s: %s", type(error).__name__, error)
        sys.exit(1)
    except OSError as error:  # a read-only or full workdir, a file one may not read: the user's to fix, one line
        if error.errno not in _USER_OS_ERRORS:
            raise
        logging.error("%s: %s%s", type(error).__name__, error.strerror or error,
                      f": {error.filename}" if error.filename else "")
        sys.exit(1)


def quiet_http_clients() -> None:
    """HTTP clients log every request at INFO: httpx (the proxy's calls upstream) and httpx2 (the `openai` SDK's
    fork, the live driver's calls to the proxy) were 21,385 of a live run's 23,380 log lines (live7), burying the
    progress lines. Their warnings and errors still show."""
    import logging as std_logging

    for name in ("httpx", "httpx2"):
        std_logging.getLogger(name).setLevel(std_logging.WARNING)


def enable_compilation_cache(workdir: str) -> None:
    """JAX's persistent compilation cache under the workdir: jobs of dozens of runs share a handful of programs,
    so each compiles once, for this run and later ones. A cache the environment names (JAX_COMPILATION_CACHE_DIR,
    e.g. one shared by a test session) is kept."""
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", str(Path(workdir) / "xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """Joins a multi-host run (`jax.distributed.initialize`), before any other JAX call.

    On Cloud TPU VMs, Slurm and Open MPI every argument is found automatically; elsewhere (e.g. GPU hosts
    started by hand) give all three. CPU hosts exchange gradients over gloo.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=coordinator_address or None, num_processes=num_processes,
                                   process_id=process_id)
    except ValueError as error:  # no cluster found and not all of the three flags given
        logging.error("--multihost: %s Outside TPU VMs, Slurm and Open MPI give --coordinator_address=HOST:PORT "
                      "(process 0's), --num_processes and --process_id on every host.", error)
        sys.exit(1)
    logging.info("process %d of %d: %d local devices, %d in all (%s)", jax.process_index(), jax.process_count(),
                 jax.local_device_count(), jax.device_count(), jax.default_backend())


def run_app(main: Callable, argv: list[str] | None = None) -> None:
    """`app.run(main)` for a launcher with a `--config` flag: `--help` also lists the config's keys and values, and
    an override naming no key of the config (`--config.reward.lamda=0.1`) is one line with the closest key, not a
    traceback from inside the flag parser. `argv` defaults to the command line (tests pass their own)."""
    heap.return_freed_memory_to_the_os()
    heap.collect_cycles_rarely()
    app.run(main, argv=argv, flags_parser=_parse_flags)


def _parse_flags(argv: list[str]) -> list[str]:
    if any(arg in _HELP for arg in argv[1:]):
        _print_help([arg for arg in argv if arg not in _HELP])
        sys.exit(0)
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as error:  # ml_collections: the override's path is not in the config
        sys.stderr.write(f"FATAL Flags parsing error: {_unknown_key_message(argv, error)}\n")
        sys.exit(1)


def _unknown_key_message(argv: list[str], error: Exception) -> str:
    """`--config.reward.lamda: config.reward has no key 'lamda'; did you mean --config.reward.lam?`"""
    config = _config_named_in(argv)
    for arg in argv[1:]:
        if config is None or not arg.startswith("--config."):
            continue
        path = arg.split("=", 1)[0].removeprefix("--config.").split(".")
        node = config
        for depth, part in enumerate(path):
            if not (hasattr(node, "keys") and part in node):
                where = ".".join(["config", *path[:depth]])
                known = sorted(node.keys()) if hasattr(node, "keys") else []
                close = difflib.get_close_matches(part, known, n=1)
                hint = f"; did you mean --{where}.{close[0]}?" if close else f"; it has {', '.join(known)}"
                return f"--config.{'.'.join(path)}: {where} has no key {part!r}{hint}"
            node = node[part]
    return f"a --config override names no key of the config: {error}"


def _config_named_in(argv: list[str]):
    """The config of `--config=FILE[:ARG]`, built again (the flag parser stopped before keeping it); None if absent."""
    spec = next((arg.split("=", 1)[1] for arg in argv[1:] if arg.startswith("--config=")), None)
    if spec is None:
        return None
    path, _, arg = spec.partition(":")
    try:  # only to word the error message: any failure here falls back to ml_collections' own
        loader = importlib.util.spec_from_file_location("_launcher_config", path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
        return module.get_config(arg) if arg else module.get_config()
    except Exception:  # noqa: BLE001
        return None


def _print_help(argv: list[str]) -> None:
    """absl's usage (the launcher's docstring and flags), then every config key with its value and meaning."""
    try:
        flags.FLAGS(argv, known_only=True)   # loads --config (and its overrides); required flags may be missing
    except (flags.Error, AttributeError, KeyError):
        pass
    app.usage(shorthelp=True, writeto_stdout=True)
    config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
    if config is not None:
        print("\nconfig keys (override any with --config.KEY=VALUE; what each means, from rivet_jax/settings.py):")
        for key, value in flatten(config.to_dict()).items():
            meaning = settings.meaning(key)
            print(f"  --config.{key}={value!r}" + (f"\n      {meaning}" if meaning is not None else ""))

