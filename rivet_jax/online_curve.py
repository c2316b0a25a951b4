"""The online stage's learning curve drawn after the stage, for the runs whose curve is read.

Drawing the curve during the stage (Figure 4: the router at each of `online.curve_points` rolled out on the test
manifest) costs every run a test rollout set per point, four times the validation's on RouteSim. The reproduction
trains its whole conservatism grid through the online stage but reads the curve of the chosen setting's runs
alone, a choice made after the stage. With `online.defer_curve` a run keeps its router at each curve point instead
(stage `online.CURVE`: its RVE's parameters and the card embeddings), and `draw_curves` rolls out only the runs
asked for: the same episodes as the stage would have drawn (greedy, the same draws, one `RouterGroup` per router as
the stage scores each run on a CPU), written into the run's online_curve.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections

from rivet_jax import checkpointing, evaluation, online
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import ModelPool
from rivet_jax.encoders import make_encoder
from rivet_jax.envs.base import Env, GroupMember
from rivet_jax.learner import stack
from rivet_jax.networks import make_network, rve_params
from rivet_jax.router import RouterGroup, params_shape


def kept_points(workdir: str | Path) -> list[int]:
    """The curve points whose router `workdir` kept (`online.defer_curve`), in order."""
    if not checkpointing.stage_dir(workdir, online.CURVE).is_dir():
        return []
    checkpoints = checkpointing.StageCheckpoints(workdir, online.CURVE, max_to_keep=None)
    try:
        return sorted(checkpoints.epochs())
    finally:
        checkpoints.close()


def _kept_routers(workdir: Path, encoders: dict) -> list[tuple[int, RouterGroup, ml_collections.ConfigDict, float]]:
    """(point, the router kept there as a group of one, its run's config, c_ref) for every point `workdir` kept.
    Runs of one encoder config share one encoder (`encoders`: its config -> it), and so its caches, as the runs of
    the stage do."""
    checkpoints = checkpointing.StageCheckpoints(workdir, online.CURVE, max_to_keep=None)
    try:
        points = sorted(checkpoints.epochs())
        meta = checkpoints.restore_meta(points[-1])   # one run: every point has its config, pool and encoder
        config = ml_collections.ConfigDict(meta["config"])
        pool = ModelPool.from_json(meta["pool"], path=str(checkpoints.directory / "meta"))
        if config.encoder.to_json() not in encoders:
            encoders[config.encoder.to_json()] = make_encoder(config.encoder)
        encoder = encoders[config.encoder.to_json()]
        checkpointing.check_compatible(meta, pool, encoder.fingerprint, source=str(checkpoints.directory))
        shapes = rve_params(params_shape(make_network(config), meta["state_dim"], pool))
        like = {"params": jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
                "cards": jnp.zeros((len(pool), meta["state_dim"]), jnp.float32)}                    # (M, D)
        kept = [checkpoints.restore(like, point)[0] for point in points]
    finally:
        checkpoints.close()
    return [(point, RouterGroup(stack([router["params"]]), pool, encoder, config, router["cards"]), config,
             meta["c_ref"]) for point, router in zip(points, kept)]


def draw_curves(workdirs: Sequence[str | Path], env: Env) -> None:
    """The learning curve of every run of `workdirs` that kept its curve points and has not drawn them yet, rolled
    out together in `env` and written into its online_curve.json (a run that drew its curve in the stage, or has
    drawn it here before, is left as it is)."""
    pending, encoders = [], {}
    for workdir in map(Path, workdirs):
        points = kept_points(workdir)
        drawn = [p["trajectories"] for p in online.read_progress(workdir)["curve"]]
        if points and drawn != points:
            pending += [(workdir, *kept) for kept in _kept_routers(workdir, encoders)]
    # routers whose runs roll out alike (split, rollouts per task, draws) together, as the stage's runs are
    together: dict[tuple, list] = {}
    for kept in pending:
        drawing = kept[3].online
        together.setdefault((drawing.test_split, drawing.eval_rollouts, drawing.eval_seed), []).append(kept)
    curves: dict[Path, list[dict]] = {}
    for (split, rollouts, seed), routers in together.items():
        episodes = evaluation.rollout_each(env, [GroupMember(group, 0) for _, _, group, _, _ in routers], split,
                                           rollouts, seed)
        for (workdir, point, _, run_config, c_ref), run_episodes in zip(routers, episodes):
            metrics = evaluation.episode_metrics(run_episodes, Reward.of(run_config, c_ref), rollouts)
            curves.setdefault(workdir, []).append({"trajectories": point, **metrics})
    for workdir, curve in curves.items():
        path = workdir / online.CURVE_FILE
        progress = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**progress, "curve": curve}, indent=2) + "\n", encoding="utf-8")
