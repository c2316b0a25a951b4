"""The deployable router: RVE only, pre-call only (Eq. 5).

    router = Router.from_checkpoint("/tmp/rivet")
    decision = router.route(task_prompt, history, available=["coder-m", "sage-s"])
    decision.model, decision.scores    # chosen model, {model: Q_route} for every candidate

    ensemble = Router.ensemble([Router.from_checkpoint(d) for d in run_dirs])  # mean Q_route of several runs

The router sees the task and the completed turns (response + feedback), serialized exactly as in training; never
the response of the call it is about to make, and never which models answered earlier (a committed router reads the
last turn's model only to keep calling it).

A training workdir that `rivet_jax.fit` (launch.train) ended with a validated choice holds `deploy.json`
(`rivet_jax/deploy.py`): `Router.from_checkpoint(W)` loads that choice (its runs, stage, recentring and whether it
commits); an explicit `stage` loads that stage's checkpoint of W's own run, as trained.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rivet_jax import checkpointing
from rivet_jax.data.cards import card_features, placeholder_cards, with_new_cards
from rivet_jax.data.prompt_cache import cache_aware, call_savings, saving_per_token
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import ModelCard, ModelPool, Turn
from rivet_jax.data.serialize import BLOCK_SEPARATOR, state_blocks
from rivet_jax.data.validation import DataError
from rivet_jax.deployment_file import check_models, has_deployment, read_deployment_spec
from rivet_jax.encoders import Encoder, make_encoder
from rivet_jax.encoders.base import encode_states
from rivet_jax.networks import RivetNet, init_params, lambda_conditioned, make_network, pad_rows, rve_params
from rivet_jax.router_inputs import HistoryTurn, as_history, availability_mask, availability_masks
from rivet_jax.settings import MAX_WEIGHT, is_number

# A history turn: a Turn, or any mapping with "response" and "feedback" (and optionally "model").


@dataclasses.dataclass(frozen=True)
class RouteDecision:
    model: str                 # the argmax of Q_route over the available candidates
    scores: dict[str, float]   # Q_route of every pool model; -inf for unavailable ones


@dataclasses.dataclass(frozen=True)
class Recentring:
    """Scores floor + k (Q_route - centre), per model: `floor` (M,) each model's mean logged return as a fixed model
    on the training tasks, `centre` (M,) the router's mean Q_route over the training states. k = 0 always calls the
    best fixed model (the best available floor); k = 1 keeps the router's differences between states at each model's
    logged level; between, the differences are shrunk toward the floor (`rivet_jax/deploy.py` says why).

    `groups` {group: (floor (M,), centre (M,))}: a state whose task is of a listed group (its `task.family`; "" for
    tasks without one) is scored against its group's floor (each model's return on that group's training tasks) and
    centre (the router's mean over that group's training states): k = 0 is then "route by group", the best fixed
    model of the task's group; any other state against the overall floor and centre."""

    floor: np.ndarray   # (M,)
    centre: np.ndarray  # (M,)
    k: float
    groups: Mapping[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict)

    def __call__(self, q: np.ndarray, groups: Sequence[str | None] | None = None) -> np.ndarray:  # (B, M) -> (B, M)
        floor, centre = self.levels(len(q), groups)
        return floor + self.k * (q - centre)

    def levels(self, num_states: int, groups: Sequence[str | None] | None) -> tuple[np.ndarray, np.ndarray]:
        """The floor and centre of each of `num_states` states of `groups` (None: unknown), (B, M) or (1, M)."""
        if not self.groups or groups is None:
            return self.floor[None, :], self.centre[None, :]
        if len(groups) != num_states:
            raise ValueError(f"{len(groups)} groups for {num_states} states: give one group (or None) per state")
        pairs = [self.groups.get(group or "", (self.floor, self.centre)) for group in groups]
        return np.stack([floor for floor, _ in pairs]), np.stack([centre for _, centre in pairs])


@dataclasses.dataclass(frozen=True)
class Choice:
    """How a router turns Q_route into a choice: everything a deployment carries besides the parameters (deploy.json
    records it; `rivet_jax.deploy` chooses it on validation).

    pessimism   an ensemble scores mean - pessimism x sd over its members (0: their mean)
    recentring  scores floor + k (Q_route - centre) per model (None: Q_route as trained)
    commit      after the first turn, keep calling the previous turn's model (A/B logs: `deploy.commits`)
    """

    pessimism: float = 0.0
    recentring: Recentring | None = None
    commit: bool = False

    def __post_init__(self):
        if not (np.isfinite(self.pessimism) and self.pessimism >= 0):
            raise ValueError(f"pessimism must be a finite number >= 0, got {self.pessimism!r}")

    @property
    def reads_q_route(self) -> bool:
        """False where the floors alone decide (recentred with k = 0: a fixed model, or route by group)."""
        return self.recentring is None or self.recentring.k != 0

    def spec(self, names: Sequence[str]) -> dict:
        """Its deploy.json fields, per-model values keyed by model name (`groups` only where there are groups)."""
        r = self.recentring

        def levels(floor: np.ndarray, centre: np.ndarray) -> dict:
            return {"floor": dict(zip(names, floor.tolist())), "centre": dict(zip(names, centre.tolist()))}

        return {"pessimism": self.pessimism, "commit": self.commit, "recentring": None if r is None else {
            "k": r.k, **levels(r.floor, r.centre),
            **({"groups": {g: levels(*pair) for g, pair in r.groups.items()}} if r.groups else {})}}

    @classmethod
    def from_spec(cls, spec: Mapping, names: Sequence[str]) -> "Choice":
        """The inverse of `spec` (a deployment written before pessimism or groups were recorded has none)."""
        r = spec.get("recentring")

        def levels(part: Mapping) -> tuple[np.ndarray, np.ndarray]:
            return np.array([part["floor"][m] for m in names]), np.array([part["centre"][m] for m in names])

        recentring = None if r is None else Recentring(*levels(r), float(r["k"]),
                                                       {g: levels(part) for g, part in r.get("groups", {}).items()})
        return cls(float(spec.get("pessimism", 0.0)), recentring, bool(spec.get("commit", False)))


def keep_previous(q: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """A committed router's scores (B, M): where the previous turn's model `previous` (B,) int (-1: none, a first
    turn) is available (finite score), every other model gets -inf, so the argmax keeps calling it."""
    rows = np.flatnonzero(previous >= 0)
    rows = rows[np.isfinite(q[rows, previous[rows]])]
    out = q.copy()
    out[rows] = -np.inf
    out[rows, previous[rows]] = q[rows, previous[rows]]
    return out


# States per network call in `Router.scores_from_embeddings` (49 models x 32,429 states in one call: 6.9 GB), each
# call of B > 1 padded to that many: one program serves every round of a rollout (one per padded size cost RouteSim's
# calibrate 0.3 s of compiling each; scoring 512 rows instead of 256 costs well under a millisecond).
SCORED_ROWS = 512


class Router:
    """Scores candidate models from pre-call information with a trained RVE, or with the mean of K trained RVEs
    (`Router.ensemble`): `params` holds one run's parameters, or K runs' stacked on a leading member axis."""

    def __init__(self, params: dict, pool: ModelPool, encoder: Encoder, config: ml_collections.ConfigDict,
                 card_embeddings: np.ndarray, c_ref: float | None = None, stacked: bool = False,
                 choice: Choice = Choice(), capability_names: tuple[str, ...] | None = None):
        self.pool = pool
        self.choice = choice
        self.c_ref = c_ref  # the reference cost the router was trained with (Eq. 1), for evaluations
        self.encoder = encoder
        self.config = config
        self.lam = float(config.reward.lam)  # the trade-off it routes for (`at_lambda`: another, if conditioned)
        self.cache_aware = cache_aware(config)  # Q_route + lambda x each candidate's prompt-cache saving
        self._saving_per_token = saving_per_token(pool) if self.cache_aware else None   # read at every scoring
        self._net = make_network(config)
        rve = rve_params(params)
        self._params = rve if stacked else jax.tree.map(lambda x: x[None], rve)                  # (K, ...)
        self._card_embeddings = card_embeddings
        # The card flags the network was trained to read (its pool's; a router with new models keeps them).
        self._capability_names = pool.capability_names if capability_names is None else capability_names
        card_x, card_mask = card_features(pool, self._capability_names)
        self._cards = (jnp.asarray(card_embeddings, jnp.float32), jnp.asarray(card_x), jnp.asarray(card_mask))

    @classmethod
    def from_checkpoint(cls, workdir: str | os.PathLike, stage: str | None = None,
                        encoder: Encoder | None = None, pool: ModelPool | None = None,
                        epoch: int | None = None) -> "Router":
        """Loads the latest checkpoint of `stage` from a training workdir; without a stage, the workdir's validated
        choice (`deploy.json`, `Router.deployed`) where it has one, else its last trained stage.

        `encoder` defaults to the one named in the checkpoint's config; `pool` (e.g. your deployment's cards)
        defaults to the checkpoint's own. Both must match what the router was trained with; models that are
        temporarily unavailable are handled per call with `available`, not with another pool.

        A damaged latest checkpoint (its files no longer match their checksums) is passed over for the newest
        intact one, with a warning; parameters holding NaN or inf are refused (NonFiniteError). `epoch`: that
        epoch's checkpoint of the stage instead of the latest (one the run kept).
        """
        if stage is None and has_deployment(workdir):
            return cls.deployed(workdir, encoder=encoder, pool=pool)
        stage = stage or checkpointing.latest_stage(workdir, checkpointing.ROUTER_STAGES)
        if stage is None:
            raise FileNotFoundError(f"no checkpoint under {checkpointing.stage_dir(workdir, '*')}")
        checkpoints = checkpointing.StageCheckpoints(workdir, stage, max_to_keep=None)
        epoch = checkpoints.latest_epoch() if epoch is None else epoch
        meta = checkpoints.restore_meta(epoch)
        if meta["stage"] != stage:   # a stage's checkpoints copied under another's name: never served as that one
            raise DataError(str(checkpoints.directory / str(epoch) / "meta" / "metadata"), None, "stage",
                            f"a {meta['stage']} checkpoint in the {stage} stage's directory")
        config = ml_collections.ConfigDict(meta["config"])
        pool = pool or ModelPool.from_json(meta["pool"], path=str(checkpoints.directory / "meta"))
        encoder = encoder or make_encoder(config.encoder)
        checkpointing.check_compatible(meta, pool, encoder.fingerprint, source=str(checkpoints.directory))
        params, _ = checkpoints.restore_params(params_shape(make_network(config), meta["state_dim"], pool), epoch)
        checkpoints.close()
        _check_finite_params(params, checkpoints.directory / str(epoch))
        card_embeddings = encoder.encode([card.description for card in pool.cards])
        return cls(params, pool, encoder, config, card_embeddings, c_ref=meta["c_ref"])

    @classmethod
    def deployed(cls, workdir: str | os.PathLike, encoder: Encoder | None = None,
                 pool: ModelPool | None = None) -> "Router":
        """The router `workdir/deploy.json` names (written by `rivet_jax.fit`): its runs' checkpoints of its stage
        (an ensemble when several), with its recentring and commitment."""
        spec = read_deployment_spec(workdir)   # every field checked first: a DataError naming it (deployment_file)
        members = [cls.from_checkpoint(Path(workdir) / run, stage=spec["stage"], encoder=encoder, pool=pool,
                                       epoch=spec.get("epoch")) for run in spec["runs"]]
        router = members[0] if len(members) == 1 else cls.ensemble(members)
        check_models(spec, router.pool.names, workdir)
        if spec.get("lam") is not None:   # a lambda-conditioned router deployed at a chosen lambda (calibrate)
            router = router.at_lambda(spec["lam"])
        return router.with_choice(Choice.from_spec(spec, router.pool.names))

    @classmethod
    def ensemble(cls, members: Sequence["Router"], pessimism: float = 0.0) -> "Router":
        """One router whose Q_route is the mean of the members' (runs trained apart, e.g. with other seeds): a deep
        ensemble. Values fitted to noisy TD targets differ from run to run by more than the real gaps between
        candidates; their mean keeps what the runs agree on. The members must agree on everything but parameters.

        `pessimism` c > 0 scores mean - c * sd over the members, a lower confidence bound: a candidate the runs
        disagree on (one the logs say little about at that state) is discounted, conservatism that, unlike Eq. 10,
        does not push toward the model that wrote the history."""
        if not members:
            raise ValueError("an ensemble needs at least one member router")
        first = members[0]
        for i, other in enumerate(members[1:], start=1):
            differences = _ensemble_differences(first, other)
            if differences:
                raise ValueError(f"ensemble member {i} does not match member 0: " + "; ".join(differences))
        params = jax.tree.map(lambda *xs: jnp.concatenate(xs), *[m._params for m in members])        # (K, ...)
        return cls(params, first.pool, first.encoder, first.config, first._card_embeddings, c_ref=first.c_ref,
                   stacked=True, choice=Choice(pessimism=float(pessimism)),
                   capability_names=first._capability_names).at_lambda(first.lam)

    def with_choice(self, choice: Choice) -> "Router":
        """This router (the same parameters, shared) choosing by `choice`: a candidate of `rivet_jax.deploy` as
        `Router.deployed` will load it."""
        router = copy.copy(self)
        router.choice = choice
        return router

    @property
    def reward(self) -> Reward:
        """The reward it routes for (Eqs. 1-2): its lambda (its config's unless `at_lambda`), gamma, c_ref."""
        return Reward(self.lam, float(self.config.reward.gamma), self.c_ref)

    @property
    def lambda_conditioned(self) -> bool:
        """Whether lambda is an input of its network (trained with `reward.lam_range`), so it routes at any."""
        return lambda_conditioned(self.config)

    def at_lambda(self, lam: float) -> "Router":
        """This router (the same parameters, shared) routing for cost weight `lam` (Eq. 1, in units of c_ref). A
        fixed-lambda router routes only at the lambda it was trained for."""
        if not (is_number(lam) and 0 <= lam <= MAX_WEIGHT):
            raise ValueError(f"lambda must be a number in [0, {MAX_WEIGHT:g}], got {lam!r}")
        if not self.lambda_conditioned and float(lam) != float(self.config.reward.lam):
            raise ValueError(f"this router was trained for lambda {self.config.reward.lam:g} only; a router trained "
                             f"with --config.reward.lam_range='(low, high)' takes lambda as an input")
        router = copy.copy(self)
        router.lam = float(lam)
        return router

    @property
    def pessimism(self) -> float:
        return self.choice.pessimism

    @property
    def recentring(self) -> Recentring | None:
        return self.choice.recentring

    @property
    def commit(self) -> bool:
        return self.choice.commit

    def with_new_models(self, cards: Sequence[ModelCard]) -> "Router":
        """This router over its pool plus `cards`: models it has never seen logged, scored from their cards alone
        (the RVE reads only a model's card, never its identity). Their descriptions are embedded by the router's
        encoder and their fields read with the flags of the pool it was trained on; its own models keep their
        action ids, the new ones follow in the order given."""
        if self.recentring is not None:
            raise ValueError("this router's scores are recentred on per-model floors of its own pool; add new models "
                             "to the router it was deployed from (Router.from_checkpoint(workdir, stage=...))")
        pool, embeddings = with_new_cards(self.pool, self._card_embeddings, cards, self.encoder)
        return Router(self._params, pool, self.encoder, self.config, embeddings, c_ref=self.c_ref, stacked=True,
                      choice=self.choice, capability_names=self._capability_names).at_lambda(self.lam)

    @property
    def members(self) -> int:
        """How many runs' RVEs the scores average (1: a single trained router)."""
        return int(jax.tree.leaves(self._params)[0].shape[0])

    # ------------------------------------------------------------------------------------------------ scoring

    def state_text(self, task: str, history: Sequence[HistoryTurn]) -> str:
        return BLOCK_SEPARATOR.join(_blocks(self.encoder, self.config, task, history))

    def available_mask(self, available: Sequence[str] | None) -> np.ndarray:
        return availability_mask(self.pool, available)

    def scores_from_embeddings(self, h: np.ndarray, available: np.ndarray | None = None,
                               groups: Sequence[str | None] | None = None,
                               savings: np.ndarray | None = None) -> np.ndarray:
        """Q_route (B, M) for state embeddings (B, D); unavailable candidates get -inf. (B,) or (B, M) mask.
        `groups`: each state's task family (None: unknown), which a router recentred per group reads. `savings`
        (B, M): what each candidate's prompt cache saves at each state (`data.prompt_cache.call_savings`), which a
        cache-aware router adds as lambda x saving (None: nothing cached)."""
        h = np.asarray(h, np.float32)
        parts = [h[i:i + SCORED_ROWS] for i in range(0, max(len(h), 1), SCORED_ROWS)]
        q = np.concatenate([np.asarray(_q_route_lower(self._net, self._params, pad_rows(x, SCORED_ROWS),
                                                      self._cards, self.pessimism, self.lam))[:len(x)] for x in parts])
        if self.cache_aware and savings is not None:
            q = q + np.float32(self.lam) * np.asarray(savings, np.float32)
        if self.recentring is not None:
            q = self.recentring(q.astype(np.float64), groups)
        if available is not None:
            available = np.broadcast_to(available, q.shape)
            if not available.any(axis=1).all():
                raise ValueError(f"no available model for states {np.flatnonzero(~available.any(axis=1)).tolist()}")
            q = np.where(available, q, -np.inf)
        return q

    def scores(self, states: Sequence[tuple[str, Sequence[HistoryTurn]]],
               available: Sequence[Iterable[str] | None] | None = None,
               groups: Sequence[str | None] | None = None) -> np.ndarray:
        """Batched Q_route (B, M) for (task, history) pairs, with an optional availability list per state (one per
        state: a list of names for every state would silently apply one state's availability to all) and an
        optional task family per state (`groups`, one per state; None: unknown)."""
        states = list(states)
        for i, (task, _) in enumerate(states):
            if not isinstance(task, str):  # str(None) or str(b"...") would route on the wrong text
                raise TypeError(f"state {i}: the task must be a string, got {type(task).__name__}")
        mask = None
        if available is not None:
            available = list(available)
            if len(available) != len(states):
                raise ValueError(f"available has {len(available)} entries for {len(states)} states: give one "
                                 f"availability (a list of names, or None) per state")
            mask = availability_masks(self.pool, available) if states else None
        blocks = [_blocks(self.encoder, self.config, task, history) for task, history in states]
        savings = None
        if self.cache_aware and states:   # the previous turn's model and prompt say whose cache holds what
            savings = np.stack([call_savings(history[-1] if history else None, self.pool, self.c_ref,
                                             self._saving_per_token) for _, history in states])
        q = self.scores_from_embeddings(encode_states(self.encoder, blocks), mask, groups, savings)
        if self.commit:
            q = keep_previous(q, np.array([self._previous_model(history) for _, history in states], int))
        return q

    def _previous_model(self, history: Sequence[HistoryTurn]) -> int:
        """Pool index of the model that answered the last turn of `history`; -1 for none or unknown (a history
        without models, e.g. a proxy's conversation: the committed router then routes that turn afresh)."""
        if not history:
            return -1
        last = history[-1]
        model = last.model if isinstance(last, Turn) else last.get("model") if isinstance(last, Mapping) else None
        return self.pool.index(model) if isinstance(model, str) and model in self.pool else -1

    def route(self, task: str, history: Sequence[HistoryTurn] = (), available: Iterable[str] | None = None,
              family: str | None = None, lam: float | None = None) -> RouteDecision:
        """The model to call next for `task` (of `family`, where known) after `history`, among `available`
        (default: the whole pool), for cost weight `lam` (default: the router's; see `at_lambda`)."""
        router = self if lam is None else self.at_lambda(lam)
        q = router.scores([(task, history)], None if available is None else [available], [family])[0]
        if np.isnan(q).any() or np.isposinf(q).any():  # an argmax over NaN would pick a model at random
            raise FloatingPointError(f"non-finite scores {dict(zip(self.pool.names, q.tolist()))} for this state")
        return RouteDecision(model=self.pool.names[int(np.argmax(q))],
                             scores={name: float(v) for name, v in zip(self.pool.names, q)})


class RouterGroup:
    """R routers of one network shape (the runs of a run group) scored together: their RVE parameters stacked on a
    leading run axis (R, ...), every pending state of every run embedded in one encoder pass and scored in one
    vmapped network call. Member policies (`envs.base.GroupMember`) decide through it jointly.

    `params` may also be a list of stacked parts (R_p, ...), runs numbered across them in order: each part is then
    scored in a call of its own (the encoder pass still one for all), as if each part were a group. Per-part calls
    keep each run's arithmetic that of its own part (a vmap over more runs may round differently), and on a CPU a
    part of one run is the faster shape: a vmapped call over many runs' large batches is memory-bound."""

    def __init__(self, params: dict | Sequence[dict], pool: ModelPool, encoder: Encoder,
                 config: ml_collections.ConfigDict, card_embeddings: np.ndarray):
        self.pool, self.encoder, self.config = pool, encoder, config
        self._net = make_network(config)
        self._parts = [rve_params(part) for part in (params if isinstance(params, (list, tuple)) else [params])]
        sizes = [int(jax.tree.leaves(part)[0].shape[0]) for part in self._parts]
        self._starts = np.cumsum([0] + sizes)                      # run r is in part p where starts[p] <= r
        self.size = int(self._starts[-1])
        card_x, card_mask = card_features(pool)
        self._cards = (jnp.asarray(card_embeddings, jnp.float32), jnp.asarray(card_x), jnp.asarray(card_mask))

    def scores(self, runs: Sequence[int], states: Sequence[Sequence[tuple[str, Sequence[HistoryTurn]]]],
               available: Sequence[Sequence[Sequence[str]]]) -> list[np.ndarray]:
        """Q_route (B_k, M) of run `runs[k]` on its states `states[k]`; unavailable candidates get -inf."""
        blocks = [_blocks(self.encoder, self.config, task, history) for group in states for task, history in group]
        h = np.asarray(encode_states(self.encoder, blocks), np.float32)                              # (sum B_k, D)
        offsets = np.cumsum([0] + [len(group) for group in states])
        part_of = np.searchsorted(self._starts, runs, side="right") - 1
        q_rows: list = [None] * len(runs)
        for part in sorted(set(part_of.tolist())):
            ks = np.flatnonzero(part_of == part)
            rows = pad_rows(np.zeros(max(len(states[k]) for k in ks)))
            stacked = np.zeros((self._starts[part + 1] - self._starts[part], len(rows), h.shape[1]),
                               np.float32)                                                         # (R_p, B, D)
            for k in ks:
                stacked[runs[k] - self._starts[part], :len(states[k])] = h[offsets[k]:offsets[k + 1]]
            q = np.asarray(_q_route_each(self._net, self._parts[part], jnp.asarray(stacked), self._cards))
            for k in ks:                                                                           # (R_p, B, M)
                q_rows[k] = q[runs[k] - self._starts[part], :len(states[k])]
        return [np.where(availability_masks(self.pool, avail), q, -np.inf) for q, avail in zip(q_rows, available)]

    def decide_members(self, members: Sequence[tuple[object, Sequence[tuple]]]) -> list[list[tuple[str, float]]]:
        """The joint decider of `envs.base.decide_each`: (member policy, its requests) -> its (model, propensity)
        per request; each member picks from its run's greedy choice (`member.pick`)."""
        q = self.scores([m.run for m, _ in members],
                        [[(task.prompt, history) for task, history, _, _ in requests] for _, requests in members],
                        [[list(available) for _, _, available, _ in requests] for _, requests in members])
        return [[member.pick(self.pool.names[int(np.argmax(row))], available, rng)
                 for row, (_, _, available, rng) in zip(q_member, requests)]
                for (member, requests), q_member in zip(members, q)]


def _blocks(encoder: Encoder, config: ml_collections.ConfigDict, task: str,
            history: Sequence[HistoryTurn]) -> list[str]:
    """The state's blocks (`serialize.state_blocks`), serialized exactly as in training."""
    return state_blocks(task, as_history(history), encoder.count_tokens, config.max_state_tokens)


def _check_finite_params(params: dict, source) -> None:
    """Refuses parameters with NaN or inf: the scores would be NaN, and their argmax an arbitrary model."""
    bad = checkpointing.non_finite_leaves(params)
    if bad:
        raise checkpointing.NonFiniteError(f"{source}: the parameters {bad[:3]}"
                                                 f"{' ...' if len(bad) > 3 else ''} hold NaN or inf; it cannot route. "
                                                 f"load an earlier stage (stage='mc', 'td') or retrain")


def params_shape(net: RivetNet, state_dim: int, pool: ModelPool):
    """The parameter tree's shapes and dtypes (nothing computed): the target a checkpoint's params restore into."""
    cards = placeholder_cards(pool, state_dim)
    return jax.eval_shape(lambda: init_params(net, jax.random.key(0), state_dim, cards))


def _ensemble_differences(a: Router, b: Router) -> list[str]:
    """What makes two routers' scores incomparable (empty: they can be one ensemble)."""
    checks = {"pool": (list(a.pool.names), list(b.pool.names)),
              "encoder": (a.encoder.fingerprint, b.encoder.fingerprint),
              "c_ref": (a.c_ref, b.c_ref),
              "reward": (a.config.reward.to_dict(), b.config.reward.to_dict()),
              "model": (a.config.model.to_dict(), b.config.model.to_dict()),
              "max_state_tokens": (a.config.max_state_tokens, b.config.max_state_tokens)}
    return [f"{what}: {x!r} != {y!r}" for what, (x, y) in checks.items() if x != y]


@functools.partial(jax.jit, static_argnums=0)
def _q_route_lower(net: RivetNet, params: dict, h: jax.Array, cards, pessimism: float, lam: float) -> jax.Array:
    """Q_route (B, M) over the members of stacked parameters (K, ...): mean - pessimism * sd (K = 1: one run's), at
    `lam` where the network takes it."""
    lam = jnp.full(h.shape[:1], lam, jnp.float32)                                                          # (B,)
    q = jax.vmap(lambda p: net.apply({"params": p}, h, cards, lam, method=RivetNet.q_route))(params)   # (K, B, M)
    return q.mean(axis=0) - pessimism * q.std(axis=0)


@functools.partial(jax.jit, static_argnums=0)
def _q_route_each(net: RivetNet, params: dict, h: jax.Array, cards) -> jax.Array:
    """Q_route of R stacked parameter sets, each on its own states: h (R, B, D) -> (R, B, M)."""
    return jax.vmap(lambda p, x: net.apply({"params": p}, x, cards, method=RivetNet.q_route))(params, h)
