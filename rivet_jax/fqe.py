"""Fitted-Q evaluation (Le, Voloshin & Yue 2019) of many target policies at once, for `rivet_jax.ope`.

Per model m, ridge regression Q(s, m) = x(s) . W_m on FQE's features x(s) (the frozen state embedding or its top
principal directions, and 1: `heldout.principal_features`) of the target r_tc + g_c (1 - d_t) V(s_t+1), with
V(s) = sum_m pi(m | s) Q(s, m), H rounds; every channel and target policy in the same products, so one refit serves
a whole bootstrap resample. `choose_ridge` picks the penalty by cross-validation over episodes.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

import numpy as np

from rivet_jax.progress import Progress


class Logs(Protocol):
    """What FQE reads of logged episodes (`ope.Logs`: N logged states, n episodes, C reward channels)."""

    episodes: Sequence       # (n,)
    live: np.ndarray         # (n, H) bool: turn t was taken
    action: np.ndarray       # (N,) pool index of the logged model
    terminal: np.ndarray     # (N,) the episode's last turn
    reward: np.ndarray       # (N, C)
    discount: np.ndarray     # (C,)

    @property
    def episode(self) -> np.ndarray: ...  # (N,) the episode of each logged state


@dataclasses.dataclass(frozen=True)
class FittedQ:
    """FQE's Q for P target policies and C channels, read at the N logged states."""

    value: np.ndarray   # (N, P, C) V(s) = sum_a pi(a | s) Q(s, a)
    logged: np.ndarray  # (N, P, C) Q(s, a) of the logged model a
    coef: np.ndarray    # (D, M, P, C) Q(s, m) = features(s) . coef[:, m]: Q at any other states (`fitted_at`)


def fitted_at(fitted: FittedQ, logs: Logs, features: np.ndarray, targets: np.ndarray) -> FittedQ:
    """A fitted Q read at other logs' states (features (N', D), targets (P, N', M)): the cross-fitted model."""
    narrow = features.astype(np.float32)
    return FittedQ(policy_values(narrow, fitted.coef, Columns.of(targets)),
                   logged_q(narrow, fitted.coef, logs.action), fitted.coef)


def fit_fqe(logs: Logs, features: np.ndarray, targets: np.ndarray, weights: np.ndarray, ridge: float,
            iterations: int, columns: Columns | None = None) -> FittedQ:
    """`iterations` rounds of per-model ridge regression of r_tc + g_c (1 - d_t) V(s_{t+1}) on the transitions that
    called the model, for P target policies `targets` (P, N, M) and every channel at once; transition k weighted by
    `weights[k]` (e.g. its episode's multiplicity in a bootstrap resample; 0 = left out). The rounds read V only at
    the states of episodes with a kept transition (a resample leaves ~37% of the tasks out), the result everywhere.
    `columns`: `Columns.of(targets)`, passed by a caller that fits the same targets many times."""
    (num_policies, _, num_models), dim, episode = targets.shape, features.shape[1], logs.episode
    columns = Columns.of(targets) if columns is None else columns
    kept = np.flatnonzero(np.bincount(episode, weights > 0)[episode] > 0)     # whole episodes: next state = next row
    action, terminal, reward, weights = logs.action[kept], logs.terminal[kept], logs.reward[kept], weights[kept]
    called = [np.flatnonzero((action == m) & (weights > 0)) for m in range(num_models)]            # into `kept`
    # Each model's ridge solution (X' W X + ridge I)^-1 X' W (D, R_m), solved once: every round is then one matrix
    # product per model (numpy's BLAS alone: scipy's thread pool beside it made these small products several times
    # slower on 2 cores). A constant column (the intercept) is all but unpenalised (1e-6 of it: solvable for a model
    # no kept transition called).
    varies = features.min(axis=0) != features.max(axis=0)
    penalty = np.diag(ridge * np.where(varies, 1.0, 1e-6))                                         # (D, D)
    solutions = []
    for rows in called:
        x = features[kept[rows]]                                                                   # (R_m, D)
        weighted = x * weights[rows, None]
        solutions.append(np.linalg.solve(x.T @ weighted + penalty, weighted.T))                    # (D, R_m)
    narrow = features.astype(np.float32)  # for `policy_values`
    narrow_kept, at_kept = narrow[kept], columns.at(kept)
    following = np.where(terminal, 0, np.arange(len(kept)) + 1)                                    # next state's row
    coef = np.zeros((dim, num_models, num_policies, logs.reward.shape[1]))                         # (D, M, P, C)
    for i in range(iterations):
        value = policy_values(narrow_kept, coef, at_kept)                                          # (N', P, C)
        future = value[following]
        future[terminal] = 0.0
        y = reward[:, None, :] + logs.discount[None, None, :] * future                              # (N', P, C)
        for m, (solution, rows) in enumerate(zip(solutions, called)):
            # Q(., m) of the policies that choose m (all the values read), then every policy's (the logged Q's)
            policies = np.arange(num_policies) if i == iterations - 1 else at_kept.policies[m]
            if policies.size:   # (a fold or resample may keep no transition that called m: R_m = 0)
                target = y[rows][:, policies].reshape(len(rows), len(policies) * y.shape[2])      # (R_m, P_m C)
                coef[:, m, policies] = (solution @ target).reshape(dim, len(policies), -1)
    return FittedQ(policy_values(narrow, coef, columns), logged_q(narrow, coef, logs.action), coef)


SPARSE = 0.5  # a column read at no more than this share of the states is computed at those states only


@dataclasses.dataclass(frozen=True)
class Columns:
    """The columns Q_p(., m) that V_p(s) = sum_m pi_p(m | s) Q_p(s, m) reads, with their probabilities: per model m,
    the policies that choose m at some state (most policies never choose most of the 49-model pool's models). A
    column read at most states (a fixed model's) is computed at every state, in one product with all such columns;
    the others (a router's choice of one model among many) only at the states where some policy chooses that model.
    On the 49-model pool's validation split (62 policies, 10,583 states) that is 0.8 million column-states instead
    of 8.8 million. Computed once per set of targets (`of`), restricted to a resample's states (`at`)."""

    num_states: int
    num_policies: int
    dense: tuple                  # per model with such columns: (m, policies (K_m,))
    dense_probability: np.ndarray  # (N, K) float32, those columns side by side in that order
    sparse: tuple                 # per model with such columns: (m, policies (K,), states (S,), probability (S, K))
    policies: tuple               # per model m: the policies of both kinds (K_m,), ascending

    @classmethod
    def of(cls, targets: np.ndarray) -> "Columns":
        """From target distributions (P, N, M)."""
        num_policies, num_states, num_models = targets.shape
        chooses = targets > 0
        share = chooses.mean(axis=1)                                                               # (P, M)
        dense, dense_probability, sparse, policies = [], [np.zeros((num_states, 0), np.float32)], [], []
        for m in range(num_models):
            chosen = np.flatnonzero(share[:, m] > 0)
            wide, narrow = chosen[share[chosen, m] > SPARSE], chosen[share[chosen, m] <= SPARSE]
            if wide.size:
                dense.append((m, wide))
                dense_probability.append(targets[wide, :, m].T.astype(np.float32))
            if narrow.size:
                states = np.flatnonzero(chooses[narrow, :, m].any(axis=0))
                probability = targets[np.ix_(narrow, states, [m])][..., 0].T.astype(np.float32)    # (S, K)
                sparse.append((m, narrow, states, probability))
            policies.append(chosen)
        return cls(num_states, num_policies, tuple(dense), np.concatenate(dense_probability, axis=1), tuple(sparse),
                   tuple(policies))

    def at(self, states: np.ndarray) -> "Columns":
        """The same columns read at `states` (ascending indices) only."""
        position = np.full(self.num_states, -1)
        position[states] = np.arange(len(states))
        sparse = []
        for m, policies, rows, probability in self.sparse:
            kept = position[rows] >= 0
            if kept.any():
                sparse.append((m, policies, position[rows[kept]], probability[kept]))
        return Columns(len(states), self.num_policies, self.dense, self.dense_probability[states], tuple(sparse),
                       self.policies)


def policy_values(features: np.ndarray, coef: np.ndarray, columns: Columns) -> np.ndarray:
    """V_p(s) = sum_m pi_p(m | s) Q_p(s, m) with Q_p(s, m) = [h(s), 1] . W[:, m, p]: features (N, D) float32, coef
    (D, M, P, C), `columns` of the targets -> (N, P, C). The dense columns in one product (one per model read the
    (N, D) features 49 times on the 49-model pool: 1.1 s a call, then 0.45), summed per policy by a product with the
    one-hot rows of each column's policy; each model's sparse columns at their states. In float32 (the fit's most
    repeated step; rounding far below the noise)."""
    num_states, channels, num_policies = features.shape[0], coef.shape[-1], columns.num_policies
    value = np.zeros((num_states, num_policies, channels), np.float32)
    if columns.dense:
        wide = np.concatenate([coef[:, m, policies].transpose(0, 2, 1) for m, policies in columns.dense],
                              axis=2).reshape(coef.shape[0], -1).astype(np.float32)  # (D, C K), rows reshape to (C, K)
        owner = np.concatenate([policies for _, policies in columns.dense])                   # (K,) the policy of each
        weighted = (features @ wide).reshape(num_states, channels, len(owner)) * (                       # (N, C, K)
            columns.dense_probability[:, None, :])
        summed = weighted.reshape(-1, len(owner)) @ np.eye(num_policies, dtype=np.float32)[owner]   # (N C, P)
        value += summed.reshape(num_states, channels, num_policies).transpose(0, 2, 1)
    for m, policies, states, probability in columns.sparse:
        block = features[states] @ coef[:, m, policies].reshape(coef.shape[0], -1).astype(np.float32)  # (S, K C)
        value[states[:, None], policies[None, :]] += block.reshape(len(states), len(policies), channels) * (
            probability[..., None])
    return value.astype(np.float64)


def logged_q(features: np.ndarray, coef: np.ndarray, action: np.ndarray) -> np.ndarray:
    """Q_p(s, a_s) at the logged model of every state, for every policy and channel: (N, P, C)."""
    q = np.zeros((features.shape[0], *coef.shape[2:]))
    for m in np.unique(action):
        rows = np.flatnonzero(action == m)
        flat = features[rows] @ coef[:, m].reshape(coef.shape[0], -1).astype(np.float32)         # (R_m, P C)
        q[rows] = flat.astype(np.float64).reshape(len(rows), *coef.shape[2:])
    return q


RIDGES = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
UNDERSMOOTH = 10.0


def choose_ridge(logs: Logs, features: np.ndarray, targets: np.ndarray, iterations: int, folds: int = 5,
                 seed: int = 0, columns: Columns | None = None) -> tuple[float, dict[float, float]]:
    """FQE's ridge penalty: the one of `RIDGES` with the least squared TD error r + g (1 - d) V(s') - Q(s, a) of the
    return on held-out episodes (FQE fitted without each of `folds` folds, errors summed over folds and targets),
    divided by `UNDERSMOOTH`. A fixed penalty is wrong somewhere (1e-2 suits 10^4 logged turns and overfits 300).
    The division: the penalty that best predicts single transitions (whose success rewards are coin flips) is too
    strong for what FQE reports, a mean of V over first states, where a weaker penalty's variance averages out and its
    smaller shrinkage does not; on RouteSim (docs/offpolicy.md) the validated penalty was 0.1 on its 987 held-out
    episodes and 1 on 280, and a tenth of it gave the smaller errors against the exact values (mean absolute error of
    J over 6 policies 0.023 against 0.036 on the 987; 0.033 against 0.042 over 7 on the 280). -> (penalty, errors)"""
    fold = np.random.default_rng(seed).permutation(len(logs.episodes))[logs.episode] % folds   # (N,)
    following = np.where(logs.terminal, 0, np.arange(len(fold)) + 1)
    errors, columns = {}, Columns.of(targets) if columns is None else columns
    progress = Progress(f"OPE: FQE fits choosing the ridge penalty ({targets.shape[0]} policies)", len(RIDGES) * folds)
    for ridge in RIDGES:
        errors[ridge] = 0.0
        for k in range(folds):
            fitted = fit_fqe(logs, features, targets, (fold != k).astype(float), ridge, iterations, columns)
            progress.step()
            value, logged = fitted.value[..., 0], fitted.logged[..., 0]                               # (N, P)
            future = np.where(logs.terminal[:, None], 0.0, value[following])
            td = logs.reward[:, None, 0] + logs.discount[0] * future - logged
            errors[ridge] += float(np.square(td[fold == k]).sum())
    return min(errors, key=errors.get) / UNDERSMOOTH, errors
