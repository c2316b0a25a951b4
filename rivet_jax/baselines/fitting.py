"""The full-batch training loop shared by the two learned single-turn routers (EmbedLLM-style matrix factorisation
and RouterDC-style contrastive): initialise a flax module, run `steps` AdamW updates in one jitted `lax.scan`, and
refuse a non-finite loss.

The jitted functions are module-level and keyed on their static (module, loss, hyperparameters), so refitting a
router on data of the same shapes reuses the compiled code.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["masked_mean", "check_training", "fit_network", "apply_network"]

# loss_fn(params, net, data) -> scalar loss; `data` is a dict of arrays, all of them traced.
LossFn = Callable[[Any, nn.Module, dict], jax.Array]


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `x` over the entries where `mask` holds; 0 (not NaN) for an empty mask."""
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def check_training(steps: int, lr: float) -> None:
    """ValueError for a schedule that cannot train: checked before any table or compile work."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")


@functools.partial(jax.jit, static_argnames=("net", "loss_fn", "steps", "lr", "weight_decay"))
def _train(params: Any, data: dict, *, net: nn.Module, loss_fn, steps: int, lr: float, weight_decay: float):
    """`steps` full-batch AdamW updates of loss_fn(params, net, data) in one `lax.scan`: (params, (steps,) losses).

    Module-level and keyed on static (net, loss_fn, hyperparameters), so refitting on data of the same shapes
    reuses the compiled loop."""
    tx = optax.adamw(lr, weight_decay=weight_decay)

    def step(carry, _):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, net, data)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), None, length=steps)
    return params, losses


@functools.partial(jax.jit, static_argnums=0)
def _init(net: nn.Module, key: jax.Array, h: jax.Array) -> Any:  # h: (1, D), only its shape matters
    return net.init(key, h)["params"]


def _check_finite(name: str, losses: np.ndarray) -> None:
    if not np.all(np.isfinite(losses)):
        first = int(np.argmin(np.isfinite(losses)))
        raise FloatingPointError(f"{name}: non-finite training loss (first at step {first})")


def fit_network(net: nn.Module, loss_fn: LossFn, data: dict, h: jax.Array, *, seed: int, steps: int, lr: float,
                weight_decay: float, name: str) -> tuple[Any, np.ndarray]:
    """Initialise `net` from `seed` on one row of the (N, D) task embeddings `h` and train it on `data`.

    Returns the trained params and the (steps,) per-step losses; raises FloatingPointError, naming the router
    `name` and the first bad step, if any loss is non-finite."""
    params = _init(net, jax.random.key(seed), h[:1])
    params, losses = _train(params, data, net=net, loss_fn=loss_fn, steps=int(steps), lr=float(lr),
                            weight_decay=float(weight_decay))
    losses = np.asarray(losses)
    _check_finite(name, losses)
    return params, losses


@functools.partial(jax.jit, static_argnums=0)
def apply_network(net: nn.Module, params: Any, h: jax.Array):
    """net's output on (B, D) task embeddings, jitted once per module."""
    return net.apply({"params": params}, h)
