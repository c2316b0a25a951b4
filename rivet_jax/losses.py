"""RIVET's losses (Eq. 7-11), written per example in the rlax style and batched with `jax.vmap` where used.

Names: `_t` is the logged turn, `_tp1` the next state. Availability is a boolean mask over the M candidates, used
for every max, argmax and logsumexp, so an unavailable model never supplies a target or absorbs probability mass.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

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
