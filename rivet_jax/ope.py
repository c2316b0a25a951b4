"""Off-policy evaluation (OPE): the value of a router, estimated from held-out logs alone.

For each target policy pi and each reward channel c (the return of Eqs. 1-2, the success y, the dollar cost), from
n logged episodes i with turns t = 0..T_i - 1, logged actions a_it, behaviour propensities mu_it = mu(a_it | s_it),
rewards r_itc and discounts g_c (gamma for the return; 1 for success and cost, so those are per-episode totals: the
mean outcome and the dollars per episode, estimated exactly as J is, channel by channel):

  w_it = prod_{k <= t} pi(a_ik | s_ik) / mu_ik      cumulative importance ratio; after the episode ends it keeps its
                                                    last value (an absorbing state); w_i,-1 = 1
  IS   = 1/n sum_i sum_t g^t w_it r_itc             per-decision importance sampling (Precup, Sutton & Singh 2000)
  WIS  = sum_t g^t sum_i w_it r_itc / sum_i w_it    per-decision weighted IS (ibid.); a turn where every weight is 0
                                                    adds 0
  FQE  = 1/n sum_i V(s_i0)                          fitted-Q evaluation (Le, Voloshin & Yue 2019): Q(s, a) regressed on
         V(s) = sum_a pi(a | s) Q(s, a)             every logged transition with target r_tc + g_c (1 - d_t) V(s_t+1),
                                                    H rounds (H: the longest episode)
  DR   = 1/n sum_i sum_t g^t (w_it (r_itc - Q(s_it, a_it)) + w_i,t-1 V(s_it))
                                                    per-decision doubly robust with FQE's Q (Jiang & Li 2016's
                                                    recursion, unrolled as in Thomas & Brunskill 2016)
  WDR  = DR with each turn's weights normalised to sum to 1 over the episodes, as WIS normalises IS (weighted DR,
         Thomas & Brunskill 2016): biased but bounded where DR's few large weights make it explode

No maintained library fits: `obp` evaluates one-step (bandit) policies, `scope-rl` builds on d3rlpy and torch.

A deterministic target (an argmax router, a fixed model) has pi(a | s) in {0, 1}: an episode's weight is 0 from its
first turn where the logged model is not the target's choice, and 1 / prod mu before. So IS and WIS of a router
rest on the few episodes that happen to follow it to the end (`followed`, `ess` in the rows); with a uniform
logger over 6 models and ~7 turns that is 6^-7 of them, and their bootstrap interval cannot show what is missing.
IS, WIS, DR and WDR need behaviour probabilities that are correct for the policy that wrote each episode, and a
logger giving every available model a positive probability (assumed of any logger with propensities below 1):

- No propensities logged (None): they are skipped; FQE only.
- Propensity 1 at a turn with more than one model available (a deterministic logger): a target that deviates there
  has no support, and IS is undefined. Such episodes are left out of IS, WIS, DR and WDR. This is also what a corpus
  that mixes deterministic and stochastic loggers needs (RouteSim's: six fixed models and a random router): the
  behaviour policy of the pooled corpus is the mixture, whose probability of the logged model given the history is
  not the 1 a fixed-model episode recorded, and the mixture's state-dependent probabilities are not in the logs.
  The stochastic episodes alone are a sample of their own logger with correct propensities, so the IS family uses
  them alone (unbiased for the logs' task distribution when the loggers were assigned to tasks independently of the
  outcome, as in RouteSim's corpus, where every logger ran every task). FQE needs no propensities and uses all.
  Turns the proxy served (`Turn.router` recorded, `launch.serve`) are the exception: their propensity, 1 for a
  greedy turn included, is the exact probability of the one live policy that drew them, so they are used.

Intervals: a percentile bootstrap over tasks, each drawn task bringing all its episodes (a fixed seed; the same B
resamples for every policy and estimator; FQE refitted on each, so FQE's and (W)DR's intervals include the fitting's
variance; in `heap.numpy_phase`). Not `scipy.stats.bootstrap`: one statistic per call, and BCa's jackknife n refits.

FQE's function class: per model m, ridge regression Q(s, m) = [h(s), 1] . W_m on the frozen-encoder embedding h(s)
of the router's own state text (`serialize_state`), the intercept unpenalised, the penalty cross-validated over
episodes and then weakened tenfold (`fqe.choose_ridge` says why). Linear, not the RIVET network with a TD loss: each
round is one closed-form solve per model, deterministic (no seed, learning rate or stopping rule to tune against
the truth), fits every channel and target policy at once, and so is refitted on every bootstrap resample. Its error
is what the class cannot represent: on RouteSim (`experiments/ope_validation.py`, docs/offpolicy.md) it was the
most accurate estimator on held-out logs, and optimistic for a router on the logs it was trained on.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
from absl import logging

from rivet_jax import heap
from rivet_jax.data.replay import Reward, availability, turn_rewards
from rivet_jax.data.schema import Episode, ModelPool
from rivet_jax.data.serialize import serialize_state
from rivet_jax.encoders import Encoder
from rivet_jax.envs.base import Policy, RandomPolicy, Request, decide
from rivet_jax.fqe import RIDGES, Columns, choose_ridge, fit_fqe, fitted_at
from rivet_jax.progress import Progress

CHANNELS = ("return", "success", "cost")
ESTIMATORS = ("IS", "WIS", "FQE", "DR", "WDR")


@dataclasses.dataclass(frozen=True)
class Logs:
    """n held-out episodes as the estimators read them. N = sum of episode lengths (the logged states), turns padded to
    the longest episode's H, C = 3 channels, M pool models."""

    episodes: tuple[Episode, ...]
    row: np.ndarray          # (n, H) int: the turn's index among the N logged states (0 on padding; see `live`)
    live: np.ndarray         # (n, H) bool: turn t was taken
    reward: np.ndarray       # (N, C) Eq. 1's r_t, the success d_t y, the dollar cost c_t
    action: np.ndarray       # (N,) int pool index of the logged model
    propensity: np.ndarray   # (N,) behaviour probability of the logged model; nan where none was logged
    available: np.ndarray    # (N, M) bool
    terminal: np.ndarray     # (N,) bool: the episode's last turn (its next state, row + 1, belongs to the next episode)
    discount: np.ndarray     # (C,) gamma for the return; 1 for success and cost (per-episode totals)
    served: np.ndarray       # (N,) bool: chosen by a known live policy (`Turn.router`: the proxy), its propensity exact

    @property
    def first(self) -> np.ndarray:  # (n,) the row of each episode's first state
        return self.row[:, 0]

    @property
    def episode(self) -> np.ndarray:  # (N,) the episode each logged state belongs to
        return np.repeat(np.arange(len(self.episodes)), self.live.sum(axis=1))


def read_logs(episodes: Sequence[Episode], pool: ModelPool, reward: Reward) -> Logs:
    """Episodes (validated against `pool`) -> `Logs`, rewards at the given lambda, gamma and c_ref (Eq. 1)."""
    lam, gamma, c_ref = reward
    if not episodes:
        raise ValueError("no episodes to evaluate on")
    lengths = np.array([len(e.turns) for e in episodes])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    steps = np.arange(lengths.max())
    live = steps[None, :] < lengths[:, None]                                                        # (n, H)
    reward = np.concatenate([np.stack([turn_rewards(np.array([t.cost for t in e.turns]), e.outcome, lam, c_ref),
                                       (np.arange(len(e.turns)) == len(e.turns) - 1) * float(e.outcome),
                                       [t.cost for t in e.turns]], axis=1) for e in episodes])    # (N, C)
    turns = [t for e in episodes for t in e.turns]
    return Logs(episodes=tuple(episodes), row=np.where(live, starts[:, None] + steps[None, :], 0), live=live,
                reward=reward, action=np.array([pool.index(t.model) for t in turns]),
                propensity=np.array([np.nan if t.propensity is None else t.propensity for t in turns]),
                available=np.stack([availability(t.available, pool) for t in turns]),
                terminal=np.concatenate([np.arange(k) == k - 1 for k in lengths]),
                discount=np.array([gamma, 1.0, 1.0]), served=np.array([t.router is not None for t in turns]))


def state_requests(logs: Logs, pool: ModelPool) -> list[Request]:
    """What a policy reads at each of the N logged states: task, completed turns, available models (and a generator
    that deterministic policies ignore)."""
    rng = np.random.default_rng(0)
    names = np.array(pool.names)
    return [(e.task, e.turns[:t], list(names[logs.available[start + t]]), rng)
            for e, start in zip(logs.episodes, logs.first) for t in range(len(e.turns))]


def target_distribution(policy: Policy, requests: Sequence[Request], pool: ModelPool) -> np.ndarray:
    """pi(. | s) (N, M) at every logged state: uniform over the available models for the random router, else the
    policy's choice with probability 1 (a stochastic target other than the random router is refused: its choice's
    propensity alone is not its distribution)."""
    probs = np.zeros((len(requests), len(pool)))
    if isinstance(policy, RandomPolicy):
        for k, (_, _, available, _) in enumerate(requests):
            probs[k, [pool.index(m) for m in available]] = 1.0 / len(available)
        return probs
    for k, (model, propensity) in enumerate(decide(policy, requests)):
        if propensity is not None and propensity < 1.0:
            raise ValueError(f"{policy.name} chose {model} with probability {propensity}: OPE needs a deterministic "
                             f"target or the random router")
        probs[k, pool.index(model)] = 1.0
    return probs


@dataclasses.dataclass(frozen=True)
class Support:
    """Which episodes the importance-weighted estimators may use, and why (the note goes into every report)."""

    episodes: np.ndarray  # (n,) bool: logged stochastically at every turn, with propensities
    note: str


def logging_support(logs: Logs) -> Support:
    """Episodes whose every turn has a propensity below 1 (or had one model to choose from): a logger with full
    support whose recorded probabilities are its own (module docstring). A turn the proxy served (`Turn.router`
    recorded) carries the exact probability of its live policy, 1 included (a greedy turn), and is always used."""
    missing = np.isnan(logs.propensity)
    forced = logs.available.sum(axis=1) == 1
    stochastic = ~missing & ((logs.propensity < 1.0) | forced | logs.served)                      # (N,)
    per_episode = np.where(logs.live, stochastic[logs.row], True).all(axis=1)                      # (n,)
    n, k = len(per_episode), int(per_episode.sum())
    if missing.all():
        note = "no propensities in the logs: IS, WIS, DR and WDR are undefined and skipped; FQE only"
    elif k == 0:
        note = ("every episode was logged deterministically (propensity 1 where several models were available): "
                "importance sampling is undefined for any policy that deviates from the logger; IS, WIS, DR and WDR "
                "skipped; FQE only")
    elif k < n:
        note = (f"IS, WIS, DR and WDR use the {k} of {n} episodes logged stochastically at every turn; the other "
                f"{n - k} have missing propensities or propensity 1 where several models were available "
                f"(deterministic loggers): in a mixture of loggers that recorded 1 is not the mixture's behaviour "
                f"probability, so they are left out. FQE uses all {n}")
    else:
        note = f"every estimator uses all {n} episodes"
    return Support(per_episode, note)


def cumulative_weights(logs: Logs, target: np.ndarray) -> np.ndarray:
    """w_it (n, H): prod_{k <= t} pi(a_k | s_k) / mu_k, its last value kept after the episode ends (nan propensities
    give nan weights: only supported episodes may be read)."""
    ratio = target[np.arange(len(logs.action)), logs.action] / logs.propensity                    # (N,)
    return np.cumprod(np.where(logs.live, ratio[logs.row], 1.0), axis=1)


def discount_powers(logs: Logs) -> np.ndarray:  # (H, C): g_c ** t
    return logs.discount[None, :] ** np.arange(logs.live.shape[1])[:, None]


def padded(logs: Logs, per_state: np.ndarray) -> np.ndarray:
    """(N, ...) per logged state -> (n, H, ...), zeros on padding."""
    live = logs.live.reshape(logs.live.shape + (1,) * (per_state.ndim - 1))
    return np.where(live, per_state[logs.row], 0.0)


def is_terms(logs: Logs, weights: np.ndarray) -> np.ndarray:
    """(n, C) per episode sum_t g^t w_t r_t: IS is their mean, DR adds its control variate to them."""
    return np.einsum("nh,nhc,hc->nc", weights, padded(logs, logs.reward), discount_powers(logs))


def wis(logs: Logs, weights: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-decision WIS (B, C) for each row of episode multiplicities `counts` (B, n)."""
    return np.einsum("bhc,hc->bc", normalised(counts, weights, padded(logs, logs.reward)), discount_powers(logs))


def wdr(logs: Logs, weights: np.ndarray, counts: np.ndarray, q_logged: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per-decision weighted DR (B, C): `dr_terms` with the weights of each turn normalised to sum to 1 over the
    episodes, as WIS normalises IS (Thomas & Brunskill 2016, WDR); w_-1 = 1 for every episode."""
    before = np.concatenate([np.ones((weights.shape[0], 1)), weights[:, :-1]], axis=1)               # (n, H)
    per_turn = (normalised(counts, weights, padded(logs, logs.reward - q_logged))
                + normalised(counts, before, padded(logs, value)))                                   # (B, H, C)
    return np.einsum("bhc,hc->bc", per_turn, discount_powers(logs))


def normalised(counts: np.ndarray, weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """sum_i c_i w_it x_itc / sum_i c_i w_it (B, H, C) for multiplicities `counts` (B, n), weights (n, H) and values
    (n, H, C); 0 at a turn where every weight is 0."""
    numerator = np.einsum("bn,nh,nhc->bhc", counts, weights, values)
    denominator = (counts @ weights)[:, :, None]                                                     # (B, H, 1)
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


def dr_terms(logs: Logs, weights: np.ndarray, q_logged: np.ndarray, value: np.ndarray) -> np.ndarray:
    """(n, C) per episode sum_t g^t (w_t (r_t - Q(s_t, a_t)) + w_{t-1} V(s_t)), from Q(s, a_logged) and V(s) (N, C)."""
    before = np.concatenate([np.ones((weights.shape[0], 1)), weights[:, :-1]], axis=1)               # (n, H) w_{t-1}
    terms = (weights[:, :, None] * padded(logs, logs.reward - q_logged) + before[:, :, None] * padded(logs, value))
    return np.einsum("nhc,hc->nc", terms, discount_powers(logs))


# --------------------------------------------------------------------------------------------- fitted-Q evaluation


def state_embeddings(logs: Logs, encoder: Encoder, max_tokens: int) -> np.ndarray:
    """(N, D): the frozen encoder's embedding of each logged state's text (as the router serialises it); FQE's
    features are these, or their top principal directions, and 1 (`heldout.principal_features`)."""
    texts = [serialize_state(e.task.prompt, e.turns[:t], encoder.count_tokens, max_tokens)
             for e in logs.episodes for t in range(len(e.turns))]
    return np.asarray(encoder.encode(texts), np.float64)


# ----------------------------------------------------------------------------------------------------- together


def bootstrap_counts(clusters: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """(B, n) multiplicity of each episode in each resample: the clusters (n,) int (each episode's task) drawn with
    replacement, every episode of a drawn cluster with it. Episodes of one task are not independent draws (every
    logger ran the same tasks; a task's difficulty moves all of them), so resampling episodes would give intervals
    too narrow by up to the square root of the episodes per task."""
    _, cluster = np.unique(clusters, return_inverse=True)
    num_clusters = int(cluster.max()) + 1
    draws = np.random.default_rng(seed).integers(num_clusters, size=(resamples, num_clusters))
    per_cluster = np.stack([np.bincount(d, minlength=num_clusters) for d in draws])                # (B, K)
    return per_cluster[:, cluster].astype(np.float64)                                              # (B, n)


def task_clusters(logs: Logs) -> np.ndarray:  # (n,) the task of each episode, the bootstrap's unit
    return np.array([e.task.id for e in logs.episodes])


def estimates(logs: Logs, targets: np.ndarray, weights: np.ndarray, supported: np.ndarray, features: np.ndarray,
              counts: np.ndarray, ridge: float, iterations: int, columns: Columns | None = None
              ) -> dict[str, np.ndarray]:
    """Every estimator for every target (P, N, M) and channel on one weighting of the episodes, `counts` (n,) (ones:
    the logs themselves; else a bootstrap resample's multiplicities): {estimator: (P, C)}, nan where undefined.
    `weights` (P, n, H) are the targets' cumulative importance weights, 0 on the episodes IS may not use; `supported`
    (n,) marks the episodes it may use (`Support.episodes`); `columns`: `fqe.Columns.of(targets)`, once for many
    weightings."""
    q = fit_fqe(logs, features, targets, counts[logs.episode], ridge, iterations, columns)
    out = {"FQE": np.einsum("n,npc->pc", counts, q.value[logs.first]) / counts.sum()}
    used = counts * supported
    if used.sum() == 0:
        return {**out, **{name: np.full_like(out["FQE"], np.nan) for name in ESTIMATORS if name != "FQE"}}
    return {**out,
            "IS": np.stack([used @ is_terms(logs, w) for w in weights]) / used.sum(),
            "WIS": np.stack([wis(logs, w, used[None, :])[0] for w in weights]),
            "DR": np.stack([used @ dr_terms(logs, w, q.logged[:, p], q.value[:, p])
                            for p, w in enumerate(weights)]) / used.sum(),
            "WDR": np.stack([wdr(logs, w, used[None, :], q.logged[:, p], q.value[:, p])[0]
                             for p, w in enumerate(weights)])}


def switched(weights: np.ndarray, max_weight: float) -> np.ndarray:
    """Cumulative weights (n, H) set to 0 from an episode's first turn whose weight exceeds `max_weight`: per-decision
    DR then takes the fitted model's value V(s_t) from that turn on (SWITCH, Wang, Agarwal & Dudik 2017, per
    decision). A target that a near-greedy logger followed only through a few unlikely draws would otherwise rest on
    those few episodes' weights of hundreds: some bias toward the model, for far less variance."""
    return np.where(np.cumsum(weights > max_weight, axis=1) > 0, 0.0, weights)


def crossfit_dr(logs: Logs, features: np.ndarray, targets: np.ndarray, fit_logs: Logs, fit_features: np.ndarray,
                fit_targets: np.ndarray, resamples: int, seed: int, max_weight: float = np.inf,
                parts: Sequence[np.ndarray] | None = None) -> dict:
    """Per-decision doubly robust estimates of P targets on `logs` with FQE's Q fitted on other logs (`fit_logs`,
    e.g. the training split: cross-fitting). The model is then independent of the episodes it corrects, so DR stays
    unbiased wherever the propensities are exact, and it is fitted on the larger logs once, not on every resample of
    the few held-out ones: the bootstrap (over tasks, paired across targets) resamples only the held-out terms.
    Weights beyond `max_weight` switch to the model (`switched`).
    targets (P, N, M) at `logs`' states, fit_targets (P, N_fit, M) at `fit_logs`'. Returns {"point": (P, C),
    "draws": (B, P, C), "ridge", "supported", "episodes", "tasks", "support"}; with `parts` (boolean (n,) masks of
    the episodes, e.g. disjoint halves of the tasks), "parts": one {"point", "draws", "supported", "episodes",
    "tasks"} per mask, each estimated on its own episodes alone with the one fitted model."""
    iterations = max(logs.live.shape[1], fit_logs.live.shape[1])
    with heap.numpy_phase():  # 26 fits
        ridge, _ = choose_ridge(fit_logs, fit_features, fit_targets, iterations, seed=seed)
        fitted = fitted_at(fit_fqe(fit_logs, fit_features, fit_targets, np.ones(len(fit_features)), ridge,
                                   iterations), logs, features, targets)
    support = logging_support(logs)
    terms = np.stack([dr_terms(logs, switched(np.where(support.episodes[:, None], cumulative_weights(logs, t), 0.0),
                                              max_weight),
                               fitted.logged[:, p], fitted.value[:, p]) for p, t in enumerate(targets)])  # (P, n, C)
    clusters = task_clusters(logs)

    def on(mask: np.ndarray) -> dict:  # the estimates from the episodes of `mask` alone
        used = (support.episodes & mask).astype(np.float64)
        if not used.any():
            raise ValueError(f"no held-out episode the importance-weighted estimators may use: {support.note}")
        counts = bootstrap_counts(clusters[mask], resamples, seed) * used[mask][None, :]              # (B, n_mask)
        return {"point": np.einsum("n,pnc->pc", used, terms) / used.sum(),
                "draws": np.einsum("bn,pnc->bpc", counts, terms[:, mask]) / counts.sum(axis=1)[:, None, None],
                "supported": int(used.sum()), "episodes": int(mask.sum()), "tasks": len(set(clusters[mask]))}

    out = {**on(np.ones(len(clusters), bool)), "ridge": ridge, "support": support.note}
    if parts is not None:
        out["parts"] = [on(np.asarray(mask, bool)) for mask in parts]
    return out


def support_stats(weights: np.ndarray) -> list[dict]:
    """Per target, from its final weights (n,): how many episodes it follows to the end (weight > 0) and their
    effective sample size (sum w)^2 / sum w^2. With few, IS and WIS rest on a handful of episodes and their bootstrap
    interval cannot show what unseen episodes with large weights would do."""
    return [{"followed": int((w > 0).sum()), "ess": float(w.sum() ** 2 / np.square(w).sum()) if w.any() else 0.0}
            for w in weights[:, :, -1]]                                                          # (P, n) final weights


def evaluate(logs: Logs, targets: Mapping[str, np.ndarray], features: np.ndarray, *, resamples: int = 200,
             seed: int = 0, ridge: float | None = None, iterations: int | None = None, level: float = 0.95,
             keep_draws: bool = False, channels: Sequence[str] = CHANNELS) -> dict:
    """IS, WIS, FQE and DR of every named target distribution (N, M) (`target_distribution`), each channel with a
    percentile bootstrap interval at `level` over tasks (`bootstrap_counts`: episodes of one task are resampled
    together). FQE runs `iterations` rounds, by default H (the longest episode): each round carries value one turn
    further back, so H reach the first turn of every episode; its ridge penalty is `ridge`, or (None) chosen by
    `choose_ridge` (on the first channel) and kept for every resample. `channels` names the logs' reward columns
    (`read_logs`' three; more, e.g. the return at another lambda, cost one fit less than another run).

    Returns {"support": the note on which episodes the IS family uses, "episodes": n, "supported": how many of them,
    "rows": one per policy and estimator: policy, estimator, each channel's estimate, <channel>_lo, <channel>_hi (nan
    where the estimator is undefined); the IS family's rows add `followed` and `ess` (`support_stats`)}, and the ridge
    penalty FQE used (with every candidate's cross-validation error when it was chosen). `keep_draws`: also
    "draws", {estimator: (B, P, C)} every resample's estimates (the same resamples for every policy, so paired
    differences between policies are read from them)."""
    names = list(targets)
    stacked = np.stack([targets[name] for name in names])                                           # (P, N, M)
    support = logging_support(logs)
    weights = np.stack([np.where(support.episodes[:, None], cumulative_weights(logs, t), 0.0) for t in stacked])
    iterations, boot, columns = iterations or logs.live.shape[1], [], Columns.of(stacked)
    with heap.numpy_phase():
        if ridge is None:
            logging.info("OPE: choosing FQE's ridge penalty (%d candidates x 5 folds of %d episodes, %d policies)",
                         len(RIDGES), len(logs.episodes), len(names))
        chosen = {} if ridge is not None else dict(zip(("ridge", "ridge_errors"),
                                                       choose_ridge(logs, features, stacked, iterations, seed=seed,
                                                                    columns=columns)))
        ridge = chosen.get("ridge", ridge)
        progress = Progress(f"OPE: FQE on the logs, then {resamples} bootstrap resamples ({len(names)} policies)",
                            resamples + 1)
        point = estimates(logs, stacked, weights, support.episodes, features, np.ones(len(logs.episodes)), ridge,
                          iterations, columns)
        progress.step()
        for counts in bootstrap_counts(task_clusters(logs), resamples, seed):
            boot.append(estimates(logs, stacked, weights, support.episodes, features, counts, ridge, iterations,
                                  columns))
            progress.step()
    tail = 100 * (1 - level) / 2
    rows = []
    for p, (name, stats) in enumerate(zip(names, support_stats(weights))):
        for estimator in ESTIMATORS:
            draws = np.stack([b[estimator][p] for b in boot])                                       # (B, C)
            row = {"policy": name, "estimator": estimator}
            for c, channel in enumerate(channels):
                estimate = float(point[estimator][p, c])
                lo, hi = (np.nan, np.nan) if np.isnan(estimate) else np.nanpercentile(draws[:, c], [tail, 100 - tail])
                row.update({channel: estimate, f"{channel}_lo": float(lo), f"{channel}_hi": float(hi)})
            rows.append({**row, **stats} if estimator != "FQE" else row)
    out = {"support": support.note, "episodes": len(logs.episodes), "tasks": len(set(task_clusters(logs))),
           "supported": int(support.episodes.sum()), "resamples": resamples, "level": level, "ridge": ridge,
           **chosen, "rows": rows}
    if keep_draws:
        out["draws"] = {estimator: np.stack([b[estimator] for b in boot]) for estimator in ESTIMATORS}
    return out
