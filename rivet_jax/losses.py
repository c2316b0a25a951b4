"""RIVET's losses (Eq. 7-11): every equation of Sec. 4.2 is one function here.

    Eq. 7       fit                 both estimators regress to one target (Huber)
    Eq. 8-9     double_dqn_target   the online RVE picks m*_{t+1}, the target network values it
    Eq. 10      cql                 logsumexp over available candidates minus the logged action's value
    Eq. 11      rivet_loss          a batch's loss: fit(G_t) in the MC stage, fit(Y_t) + alpha CQL in TD

A cache-aware run's batches carry each candidate's prompt-cache saving (`Batch.saving`, `next_saving`; in units of
c_ref), which the router knows before the call and adds to Q_route as lambda x saving (`data/prompt_cache.py`). The
network then learns Q_route less that known part: its targets are G_t and Y_t less the logged call's saving, Y_t
bootstraps from (and picks m*_{t+1} by) Q_route plus the next state's savings, and CQL compares the candidates'
Q_route with their savings, as the router will.

CQL as written penalises every candidate but the logged one at every logged state. Where the logs come from fixed-
model policies (RouteSim's corpus from turn 2 on, MINT everywhere) the logged model is the one that wrote the
history, so the penalty teaches "call the model that answered before" (measured: experiments/diagnostics.py).
`loss.cql_on = "stochastic"` applies it only at transitions whose logged choice was a draw (propensity < 1), where
the logged model carries no such bias; "all" is Eq. 10 as written.

The per-example functions are written in the rlax style and batched with `jax.vmap` (`batched_*`).
Names: `_t` is the logged turn, `_tp1` the next state. Availability is a boolean mask over the M candidates, used
for every max, argmax and logsumexp, so an unavailable model never supplies a target or absorbs probability mass.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rivet_jax.data.replay import Batch
from rivet_jax.networks import RivetNet
from rivet_jax.settings import LossWeights

Array = chex.Array


def huber(x: Array, delta: float = 1.0) -> Array:
    """Huber loss of a residual: x^2/2 inside [-delta, delta], linear outside."""
    abs_x = jnp.abs(x)
    quadratic = jnp.minimum(abs_x, delta)
    return 0.5 * quadratic**2 + delta * (abs_x - quadratic)


def fit(q_route_t: Array, q_resp_t: Array, target_t: Array, beta: float, delta: float = 1.0) -> Array:
    """Eq. 7 for one transition: both estimators regress to the same scalar target."""
    chex.assert_rank([q_route_t, q_resp_t, target_t], 0)
    return huber(q_route_t - target_t, delta) + beta * huber(q_resp_t - target_t, delta)


def masked_argmax(q: Array, available: Array) -> Array:
    """argmax over available candidates only."""
    return jnp.argmax(jnp.where(available, q, -jnp.inf))


def double_dqn_target(
    r_t: Array,
    done_t: Array,
    gamma: float,
    q_tp1_online: Array,
    q_tp1_target: Array,
    available_tp1: Array,
) -> Array:
    """Eqs. 8-9: the online RVE picks m*_{t+1} among available models, the target network values it.

    Y_t = r_t + gamma (1 - d_t) Q_route(s_{t+1}, m*_{t+1}; w_bar), under stop_gradient.
    """
    chex.assert_rank([r_t, done_t, q_tp1_online, q_tp1_target, available_tp1], [0, 0, 1, 1, 1])
    best_tp1 = masked_argmax(q_tp1_online, available_tp1)
    bootstrap = q_tp1_target[best_tp1]
    return jax.lax.stop_gradient(r_t + gamma * (1.0 - done_t) * bootstrap)


def cql(q_t: Array, a_t: Array, available_t: Array) -> Array:
    """Eq. 10 for one transition: logsumexp over available candidates minus the logged action's value."""
    chex.assert_rank([q_t, a_t, available_t], [1, 0, 1])
    return jax.nn.logsumexp(jnp.where(available_t, q_t, -jnp.inf)) - q_t[a_t]


# Batched forms used by training: (B,) or (B, M) arrays in, (B,) out.
batched_fit = jax.vmap(fit, in_axes=(0, 0, 0, None, None))
batched_double_dqn_target = jax.vmap(double_dqn_target, in_axes=(0, 0, None, 0, 0, 0))
batched_cql = jax.vmap(cql)


def rivet_loss(params, target_params, batch: Batch, cards, w: LossWeights, *, net: RivetNet, gamma: float,
               huber_delta: float, stage: str):
    """Eq. 11 on a batch, and its metrics: L_MC = fit(G_t) (`stage` 'mc'), L_TD = fit(Y_t) + alpha CQL ('td').

    `cards` = (e_m (M, D), x_m (M, F), mask (M, F)); `w` sets alpha, beta and the zero-response ablation (plain
    floats, or a run's traced values), `huber_delta` Eq. 7's delta, `gamma` the discount of the TD target.
    """
    e_o = batch.e_o * w.response
    q_all, q_resp = net.apply({"params": params}, batch.h_t, cards, batch.action, e_o, batch.lam,
                              method=RivetNet.q_both)                                              # (B, M), (B,)
    # what the router adds to the network's values (a cache-aware run's prompt-cache savings), 0 otherwise
    known_t, known_tp1 = (0.0, 0.0) if batch.saving is None else (batch.lam[:, None] * batch.saving,
                                                                  batch.lam[:, None] * batch.next_saving)  # (B, M)
    known_taken = 0.0 if batch.saving is None else jnp.take_along_axis(known_t, batch.action[:, None], axis=1)[:, 0]
    if stage == "mc":
        target = batch.mc_return - known_taken
    else:
        # a lambda-conditioned network bootstraps from its own policy at the transition's lambda (m*_{t+1}(lambda))
        q_tp1_online = net.apply({"params": params}, batch.h_tp1, cards, batch.lam, method=RivetNet.q_route)
        q_tp1_target = net.apply({"params": target_params}, batch.h_tp1, cards, batch.lam,
                                 method=RivetNet.q_route)                                          # (B, M) each
        # stop_gradient: the online net only *selects* m*_{t+1}; the target is a constant of this update.
        target = batched_double_dqn_target(batch.reward - known_taken, batch.done, gamma,
                                           jax.lax.stop_gradient(q_tp1_online + known_tp1), q_tp1_target + known_tp1,
                                           batch.next_available)
    q_taken = jnp.take_along_axis(q_all, batch.action[:, None], axis=1)[:, 0]  # (B,)
    fit_loss = jnp.mean(batched_fit(q_taken, q_resp, target, w.beta, huber_delta))
    # Each transition's CQL weight: 1, or (cql_on = "stochastic") whether its logged choice was a draw; the mean is
    # over the weighted transitions, so alpha keeps its scale whatever share of the logs is stochastic.
    where = 1.0 - w.cql_stochastic_only * (1.0 - batch.stochastic)                                         # (B,)
    cql_loss = jnp.zeros(()) if stage == "mc" else (
        jnp.sum(where * batched_cql(q_all + known_t, batch.action, batch.available)) / jnp.maximum(jnp.sum(where), 1.0))
    loss = fit_loss + w.alpha * cql_loss
    available_q = jnp.where(batch.available, q_all, jnp.nan)
    metrics = {"loss": loss, "fit": fit_loss, "cql": cql_loss, "q_taken": jnp.mean(q_taken),
               "q_resp": jnp.mean(q_resp), "q_mean": jnp.nanmean(available_q),
               "q_max": jnp.mean(jnp.nanmax(available_q, axis=1)), "target": jnp.mean(target)}
    return loss, metrics
