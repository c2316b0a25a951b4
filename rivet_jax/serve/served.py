"""The router a proxy serves, and its hot swap: a newly deployed router taken in between requests.

A proxy serving a workdir's deployed choice (`config.router_stage` '') watches `<workdir>/deploy.json`
(`changed`); `reload` loads a changed deployment, checks that it scores every served model, compiles it
(`warm_up`) and swaps it in as one assignment of `current` (router, version). A request takes `current` once and is
scored and recorded with it, so a swap never splits a request, and an open episode's turns record the version of
the router that chose each. A deployment that fails to load keeps the router served now; the log and `report()`
(/healthz) say why, and that same deployment is not tried again until it changes on disk.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

from absl import logging

from rivet_jax.deployment_file import DEPLOY_FILE
from rivet_jax.router import Router
from rivet_jax.serve.upstream import redact

__all__ = ["ServedRouter", "deployment_version", "warm_up"]


def deployment_version(workdir: str | os.PathLike | None, stage: str = "") -> str:
    """The version of the router a workdir serves: its deployment's content digest (`deploy:<sha256 prefix>`), or
    the stage served (`stage:<stage>`; 'last' without a deployment: the last trained stage)."""
    path = None if workdir is None or stage else Path(workdir) / DEPLOY_FILE
    if path is None or not os.path.lexists(path):
        return f"stage:{stage or 'last'}"
    try:
        return "deploy:" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    except OSError as error:   # a directory, a dangling symlink, unreadable: a version loading it will refuse
        return f"deploy:unreadable ({type(error).__name__})"


def warm_up(router: Router, max_batch: int = 16) -> None:
    """Compiles the network, and a neural encoder at its longest inputs, for every padded batch size up to
    `max_batch` (rows are padded to powers of two), so that a burst of concurrent requests does not wait for XLA.
    Shorter inputs of a neural encoder still compile on first sight."""
    long_state = "warm up " * router.config.max_state_tokens
    size = 1
    while size <= max_batch:
        router.scores_from_embeddings(router.encoder.encode([long_state] * size))
        size *= 2


class ServedRouter:
    """`current`: (the router served now, its version); `workdir`'s deployment swapped in by `reload`."""

    def __init__(self, router: Router, workdir: str | os.PathLike | None, stage: str, served: Sequence[str]):
        self.current: tuple[Router, str] = (router, deployment_version(workdir, stage))
        self.workdir, self.served = workdir, list(served)
        self.hot_swap = workdir is not None and not stage
        self.swaps = 0
        self.swap_error: tuple[str, str] | None = None     # (the version that failed to load, why)

    def changed(self, version: str | None = None) -> bool:
        """The deployment on disk (`version`, read when not given) is not the one served (nor one that already
        failed to load)."""
        version = version or deployment_version(self.workdir)
        return version != self.current[1] and (self.swap_error is None or self.swap_error[0] != version)

    def reload(self) -> dict:
        """Loads the workdir's deployment if it changed and swaps it in (module docstring). Blocking: run it in a
        thread. Returns {"version" (served now), "swapped", "error" (None, or why nothing was swapped in)}."""
        if not self.hot_swap:
            return {"version": self.current[1], "swapped": False,
                    "error": "this proxy serves a fixed stage (config.router_stage) or no workdir: nothing to reload"}
        version = deployment_version(self.workdir)   # deploy.json read and hashed once per reload
        if not self.changed(version):
            failed = self.swap_error is not None and self.swap_error[0] == version
            return {"version": self.current[1], "swapped": False, "error": self.swap_error[1] if failed else None}
        try:
            router = Router.from_checkpoint(self.workdir)
            missing = [name for name in self.served if name not in router.pool]
            if missing:
                raise ValueError(f"the new router's pool lacks the served models {missing}")
            warm_up(router)
        except Exception as error:  # noqa: BLE001 - whatever a deployment does wrong, the served router stays
            why = redact(f"{type(error).__name__}: {error}")
            logging.warning("the deployment %s (%s) did not load; still serving %s: %s", version,
                            Path(self.workdir) / DEPLOY_FILE, self.current[1], why)
            self.swap_error = (version, why)
            return {"version": self.current[1], "swapped": False, "error": why}
        logging.info("hot swap: now serving %s (was %s)", version, self.current[1])
        self.current, self.swap_error = (router, version), None
        self.swaps += 1
        return {"version": version, "swapped": True, "error": None}

    def report(self) -> dict:
        """What /healthz shows of the router."""
        return {"version": self.current[1], "swaps": self.swaps, "hot_swap": self.hot_swap,
                "last_swap_error": None if self.swap_error is None else self.swap_error[1]}
