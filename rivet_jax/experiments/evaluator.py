"""What the RouteSim experiments evaluate with: the `Evaluator` (batched rollouts, cached exact reports, recorded
traces), Table 3's Stay / Switch intervention policies, and the row format every table shares."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from typing import Sequence

import numpy as np

from rivet_jax import evaluation
from rivet_jax.baselines.registry import fit_baselines
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import Episode
from rivet_jax.encoders import EmbeddingStore, make_encoder
from rivet_jax.envs import oracle
from rivet_jax.envs.base import Policy
from rivet_jax.envs.routesim import RouteSim
from rivet_jax.progress import Progress
from rivet_jax.router import Router


class _InterventionPolicy:
    """A policy built on the router's scores, deciding a batch of turns at once (batched rollouts)."""

    def __init__(self, router: Router, name: str):
        self.router, self.name = router, name

    def act(self, task, history, available, rng):
        return self.act_batch([(task, history, available, rng)])[0]

    def act_batch(self, requests):
        q = self.router.scores([(task.prompt, history) for task, history, _, _ in requests],
                               [list(available) for _, _, available, _ in requests])      # (B, M)
        return [(self.choose(history, available, row), 1.0) for (_, history, available, _), row in zip(requests, q)]


class StayPolicy(_InterventionPolicy):
    """Table 3 'Stay': the router's first-turn model, kept for the whole episode."""

    def __init__(self, router: Router):
        super().__init__(router, "stay")

    def choose(self, history, available, q: np.ndarray) -> str:
        if history and history[0].model in available:
            return history[0].model
        return self.router.pool.names[int(np.argmax(q))]


class SwitchAtTwoPolicy(_InterventionPolicy):
    """Table 3 'Switch': at turn two the router's second-highest-scoring model, greedy elsewhere."""

    def __init__(self, router: Router):
        super().__init__(router, "switch")

    def choose(self, history, available, q: np.ndarray) -> str:
        ranked = np.argsort(-q, kind="stable")  # best first; ties in pool order
        return self.router.pool.names[int(ranked[1] if len(history) == 1 and len(available) > 1 else ranked[0])]


class RolledOut:
    """A policy rolled out elsewhere (`baselines_ahead`, in `exact_pool`'s process): `Evaluator.episodes` returns its
    episodes, per (split, models available or None), instead of rolling it out."""

    def __init__(self, name: str, episodes: dict[tuple[str, tuple | None], list[Episode]]):
        self.name, self.episodes = name, episodes


class Evaluator:
    """Rollouts and exact reports on one simulator, with the corpus' c_ref and the configured rollouts."""

    def __init__(self, sim: RouteSim, config, c_ref: float, progress: Progress | None = None):
        self.sim, self.config, self.c_ref, self.progress = sim, config, c_ref, progress
        self.traces: dict[str, list[Episode]] = {}  # router -> its recorded episodes (`record`)
        self._exact: dict = {}
        self._ahead: dict[tuple, concurrent.futures.Future] = {}   # (key, oracle_only) -> its report, solving
        self._kept: dict[tuple, tuple[object, list[Episode]]] = {}  # `episodes(reuse=...)`'s

    def solve_ahead(self, requests: Sequence[tuple[str, float, Sequence[str] | None, bool]],
                    pool: concurrent.futures.Executor) -> None:
        """Starts the exact reports `requests` ((split, lambda, available models or None, oracle only)) in `pool`
        (`exact_pool()`'s process, or any executor): they depend on the simulator, the split, lambda and c_ref alone,
        so the main job solves them (the oracle's DPs: a third of its evaluation) while its routers train. `exact`
        and `oracle` then wait for them. An oracle-only request whose full report is also asked for is not solved
        twice: the full report holds the oracle's row."""
        full = {self._key(split, lam, available) for split, lam, available, only in requests if not only}
        for split, lam, available, oracle_only in requests:
            key = self._key(split, lam, available)
            if (key, oracle_only) not in self._ahead and not (oracle_only and key in full):
                self._ahead[key, oracle_only] = pool.submit(oracle.policy_report, self.sim, split, self._reward(lam),
                                                            available=key[2], oracle_only=oracle_only)

    def baselines_ahead(self, logged: Sequence[Episode], lam: float,
                        requests: Sequence[tuple[str, Sequence[str] | None]],
                        pool: concurrent.futures.Executor) -> concurrent.futures.Future:
        """Starts fitting the baselines on `logged` at `lam` in `pool` and rolling each out on every (split, models
        available or None) of `requests`: they read the corpus alone, so the main job fits and rolls them out while
        its routers train. The future's result: {name: `RolledOut`}, what the tables take as the baselines."""
        return pool.submit(rolled_out_baselines, self.sim, self.config, logged, lam, self.c_ref,
                           [(split, _models(available)) for split, available in requests])

    def rollouts(self, policy: Policy, split: str, lam: float, available: Sequence[str] | None = None,
                 record: str | None = None, reuse: object | None = None) -> dict:
        """One router's rollouts over a split (`episodes`) and their metrics at `lam`: one unit of `progress`; the
        episodes are kept under `record`."""
        episodes = self.episodes(policy, split, available, reuse)
        if record is not None:
            self.traces.setdefault(record, []).extend(episodes)
        if self.progress is not None:
            self.progress.step()
        return evaluation.episode_metrics(episodes, self._reward(lam), self.config.evaluate.rollouts_per_task)

    def episodes(self, policy: Policy, split: str, available: Sequence[str] | None = None,
                 reuse: object | None = None) -> list[Episode]:
        """`policy`'s rollouts over a split (`evaluate.rollouts_per_task` per task, episode r of task i drawn from
        rng([evaluate.seed, r, i])). With `reuse` (e.g. the router a policy acts for) they are kept, and a later call
        with the same `reuse`, split and models available returns them instead of rolling the same policy out again:
        Tables 1, 2 and 3 read the same RIVET Online episodes."""
        if isinstance(policy, RolledOut):
            return policy.episodes[split, _models(available)]
        key = None if reuse is None else (id(reuse), split, _models(available))
        if key in self._kept:
            return self._kept[key][1]
        episodes = evaluation.rollout(self.sim, policy, split, self.config.evaluate.rollouts_per_task,
                                      self.config.evaluate.seed, available=available)
        if key is not None:
            self._kept[key] = (reuse, episodes)   # (the object too: its id stays its own while kept)
        return episodes

    def exact(self, split: str, lam: float, available: Sequence[str] | None = None) -> dict:
        """The exact report (oracle, fixed models, random) of `split` at `lam`, computed once."""
        return self._report(split, lam, available, oracle_only=False)

    def oracle(self, split: str, lam: float, available: Sequence[str] | None = None) -> dict:
        """The oracle's exact row alone (the DP of one policy instead of every policy's)."""
        return self._report(split, lam, available, oracle_only=True)["oracle"]

    def _key(self, split: str, lam: float, available: Sequence[str] | None) -> tuple:
        """(split, lambda, availability mask over the pool or None): what a report depends on, `_solve`'s arguments."""
        return split, lam, None if available is None else tuple(n in available for n in self.sim.pool.names)

    def _report(self, split: str, lam: float, available: Sequence[str] | None, oracle_only: bool) -> dict:
        key = self._key(split, lam, available)
        for only in (False, True) if oracle_only else (False,):   # a full report serves the oracle's row too
            held = self._exact.get(key)
            if (key, only) in self._ahead and (held is None or not only and "random" not in held):
                self._exact[key] = self._ahead.pop((key, only)).result()
        if key in self._exact and (oracle_only or "random" in self._exact[key]):
            return self._exact[key]
        self._exact[key] = self._solve(*key, oracle_only)
        return self._exact[key]

    def _solve(self, split: str, lam: float, mask: tuple | None, oracle_only: bool) -> dict:
        return oracle.policy_report(self.sim, split, self._reward(lam), available=mask, oracle_only=oracle_only)

    def _reward(self, lam: float) -> Reward:
        return Reward(lam, self.config.reward.gamma, self.c_ref)


def rolled_out_baselines(sim: RouteSim, config, logged: Sequence[Episode], lam: float, c_ref: float,
                         requests: Sequence[tuple[str, tuple | None]]) -> dict[str, RolledOut]:
    """`Evaluator.baselines_ahead`'s work: every baseline (`fit_baselines`) and its rollouts per request, as
    `Evaluator.episodes` rolls out. Its store embeds in memory: a worker process writes nothing to the job's
    embedding cache, which the main process writes (the hashing encoder's vectors are the cached ones, bit for bit)."""
    fitted = fit_baselines(config, logged, sim.pool, EmbeddingStore(make_encoder(config.encoder)), lam, c_ref)
    e = config.evaluate
    return {name: RolledOut(name, {(split, available): evaluation.rollout(sim, policy, split, e.rollouts_per_task,
                                                                          e.seed, available=available)
                                   for split, available in requests}) for name, policy in fitted.items()}


def _models(available: Sequence[str] | None) -> tuple | None:
    """The models available as a key (None: every model of the pool)."""
    return None if available is None else tuple(available)


def exact_pool() -> concurrent.futures.Executor:
    """Where the main job works beside its training: one worker process at the lowest CPU priority, for the oracle's
    DPs (`Evaluator.solve_ahead`), the baselines (`Evaluator.baselines_ahead`) and the Q* diagnostics. The DPs are
    numpy work in many small calls: in a thread of the job they held its interpreter in turn with the rollouts and
    took a core from the training; the process runs on what training and rollouts leave idle (the main job kept
    about 1.5 of its 2 cores busy) and gets the same numbers. Spawned, not forked: the job's JAX runs threads."""
    return concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_lowest_priority)


def _lowest_priority() -> None:
    try:   # Linux: run only where a core would otherwise idle (at nice 19 the DPs still took a share)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):   # another system, or a sandbox that refuses it: the next lowest
        if hasattr(os, "nice"):
            os.nice(19)


def row(router: str, split: str, metrics: dict, oracle_return: float, reference_cost_usd: float,
         **extra) -> dict:
    return {"router": router, "split": split, "accuracy": metrics["accuracy"], "cost_usd": metrics["cost"],
            "cost_rel": metrics["cost"] / reference_cost_usd, "return": metrics["return"],
            "regret": oracle_return - metrics["return"], "turns": metrics["turns"],
            "switch_rate": metrics["switch_rate"], **extra}


def seed_row(router: str, split: str, per_seed: list[dict], oracle_return: float, reference_cost_usd: float) -> dict:
    """Mean over seeds, with the standard deviation of accuracy, cost and return."""
    mean = {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}
    sd = {f"{k}_sd": float(np.std([m[k] for m in per_seed])) for k in ("accuracy", "cost", "return")}
    return row(router, split, mean, oracle_return, reference_cost_usd, seeds=len(per_seed),
                accuracy_sd=sd["accuracy_sd"], cost_usd_sd=sd["cost_sd"], return_sd=sd["return_sd"])
