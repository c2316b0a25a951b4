"""The learner: TrainState, the optimizer (App. B.2) and one gradient update of Eq. 11.

Every stage (MC, TD, online) steps its state through `make_update`; the engines that feed it batches are
`engine.py` (MC, TD) and `online.py`, the loss it differentiates is `losses.rivet_loss`. It takes plain values
(`settings.Optim`, `settings.UpdateRule`, `settings.LossWeights`, a seed), never a ConfigDict: the engines read the
config once.
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any, Callable, NamedTuple, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rivet_jax import losses
from rivet_jax.data.cards import placeholder_cards
from rivet_jax.data.replay import Batch, at_lambda
from rivet_jax.data.schema import ModelPool
from rivet_jax.networks import RivetNet, init_params
from rivet_jax.run_identity import flatten
from rivet_jax.settings import PER_RUN, LossWeights, Optim, UpdateRule

# Every stage's PRNG stream is folded from the run seed with its own id.
STAGE_IDS = {"mc": 0, "td": 1, "online": 2}
# The stream of a lambda-conditioned update's draws, folded from the stage key (shuffles fold in the epoch).
LAMBDA_DRAWS = 7_919


@flax.struct.dataclass
class TrainState:
    params: Any
    target_params: Any
    opt_state: Any
    step: jax.Array  # () int32, optimizer steps taken in this stage
    key: jax.Array   # typed PRNG key of this stage


def make_optimizer(optim: Optim):
    """AdamW with global-norm clipping (App. B.2); `Optim.of(config)` reads it from a config.

    `optax.flatten` runs the update on one raveled parameter vector: the same arithmetic, but a handful of large
    fused kernels instead of a few per parameter leaf, which halves the optimizer's compile time on CPU.
    """
    return optax.flatten(optax.chain(optax.clip_by_global_norm(optim.clip_norm),
                                     optax.adamw(optim.lr, weight_decay=optim.weight_decay)))


def stage_key(seed: int, stage: str) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), STAGE_IDS[stage])


def init_train_state(net: RivetNet, tx, params: Any, key: jax.Array) -> TrainState:
    # The target is a copy, not an alias: the update donates the state, and one buffer cannot be donated twice.
    return TrainState(params=params, target_params=jax.tree.map(jnp.copy, params), opt_state=jax.jit(tx.init)(params),
                      step=jnp.zeros((), jnp.int32), key=key)


def template_state(seed: int, net: RivetNet, tx, state_dim: int, pool: ModelPool, stage: str) -> TrainState:
    """A freshly initialised state of `stage` of run `seed`: the starting point of MC, and the tree shape every
    restore fills."""
    key = stage_key(seed, stage)
    cards = placeholder_cards(pool, state_dim)
    params = init_params(net, jax.random.fold_in(key, 1_000_003), state_dim, cards)
    return init_train_state(net, tx, params, key)


def apply_gradients(state: TrainState, tx, grads, sync_steps: int) -> TrainState:
    """One optimizer step, then the periodic target-network copy (every `sync_steps` steps)."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    step = state.step + 1
    target_params = optax.periodic_update(params, state.target_params, step, sync_steps)
    return state.replace(params=params, target_params=target_params, opt_state=opt_state, step=step)


def draw_lambdas(key: jax.Array, shape: tuple, lam_range: tuple) -> jax.Array:
    """lambda per transition from [low, high], as low + (high - low) u^2 (u uniform): denser near low, where the
    trade-off turns (on 15-turn episodes lambda 0.05 already makes cost dominate J)."""
    low, high = lam_range
    return low + (high - low) * jnp.square(jax.random.uniform(key, shape))


def make_update(net: RivetNet, tx, rule: UpdateRule, stage: str) -> Callable:
    """One gradient update on a gathered batch: (state, batch, cards, weights) -> (state, metrics). Not jit'ed.

    `weights` (`LossWeights`): a run's own, as plain floats or (a run group) traced values. With `rule.lam_range`
    every transition's rewards and returns are moved to a lambda drawn for it (`replay.at_lambda`), the network's
    input, from the state's key and step: a resumed run draws the same."""
    loss_fn = functools.partial(losses.rivet_loss, net=net, gamma=rule.gamma, huber_delta=rule.huber_delta,
                                stage=stage)

    def update(state: TrainState, batch: Batch, cards, weights: LossWeights):
        if rule.lam_range:
            key = jax.random.fold_in(jax.random.fold_in(state.key, LAMBDA_DRAWS), state.step)
            batch = at_lambda(batch, draw_lambdas(key, batch.reward.shape, rule.lam_range))
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, state.target_params, batch,
                                                                         cards, weights)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return apply_gradients(state, tx, grads, rule.sync_steps), metrics

    return update


# ------------------------------------------------------------------------------- many runs as one program


def shape_signature(config) -> str:
    """Everything in `config` but the keys runs of one group may differ in (`settings.PER_RUN`: values the group's
    program reads, or bookkeeping): runs with equal signatures can train as one program."""
    shared = {k: v for k, v in flatten(config.to_dict()).items() if k not in PER_RUN}
    return json.dumps(shared, sort_keys=True, default=str)


def grouped(items: Sequence, key: Callable) -> list[list]:
    """`items` split into the lists that share `key(item)` (e.g. a shape signature and a resume point)."""
    return [list(group) for _, group in itertools.groupby(sorted(items, key=key), key=key)]


def runs_vmapped(vmapped: int) -> int | None:
    """`lax.map`'s batch size over a run group for the setting `runs_vmapped` (0 = every run vmapped into each
    step), or for -1 every run on an accelerator and one at a time (None: a sequential map) on a CPU."""
    if vmapped < 0:
        vmapped = 1 if jax.default_backend() == "cpu" else 0
    return None if vmapped == 1 else vmapped


class RunValues(NamedTuple):
    """What differs between the runs of a group (`rivet_jax.engine`) besides their states: leading axis R."""

    weights: LossWeights  # each (R,) float32
    reward: jax.Array     # (R, N) float32 r_t of the logged replay at each run's lambda
    mc_return: jax.Array  # (R, N) float32 G_t at each run's lambda
    lam: jax.Array        # (R, N) float32 each run's lambda


def run_values(weights: Sequence[LossWeights], replays: Sequence[dict]) -> RunValues:
    """The values of runs r = (its loss weights, the `TrainData.replay` of its corpus read at its lambda)."""
    column = lambda name: jnp.stack([jnp.asarray(replay[name], jnp.float32) for replay in replays])
    return RunValues(weights=LossWeights(*(jnp.asarray(w, jnp.float32) for w in zip(*weights))),
                     reward=column("reward"), mc_return=column("mc_return"), lam=column("lam"))


def with_run_rewards(batch: Batch, values: RunValues, idx: jax.Array) -> Batch:
    """A gathered batch of logged transitions `idx` with one run's rewards and returns (inside a vmap over runs)."""
    return batch._replace(reward=values.reward[idx], mc_return=values.mc_return[idx], lam=values.lam[idx])


@jax.jit
def stack(trees: Sequence[Any]) -> Any:
    """R same-shaped pytrees -> one pytree with a leading run axis R (typed PRNG keys included); one compiled program
    per tree structure and R, not one per leaf shape."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


@jax.jit
def unstack(tree: Any, r: int) -> Any:
    """Run `r` of a stacked pytree (jit'ed with `r` traced: one compile per tree structure, not one per run)."""
    return jax.tree.map(lambda leaf: leaf[r], tree)


# ------------------------------------------------------------------------------------------ checkpoint trees


def saveable(state: TrainState) -> dict:
    """The state as the array tree a checkpoint holds (the PRNG key as raw key data)."""
    return {"params": state.params, "target_params": state.target_params, "opt_state": state.opt_state,
            "step": state.step, "key": jax.random.key_data(state.key)}


def from_saveable(tree: dict, placed: bool = False) -> TrainState:
    """The TrainState of a restored tree. Unless `placed` (restored onto a mesh's shardings), arrays are re-made
    as plain uncommitted ones: orbax restores committed arrays, jit outputs are uncommitted, and passing both
    kinds to one jit compiles it twice."""
    if not placed:
        tree = jax.tree.map(lambda x: jax.device_put(np.asarray(x)), tree)   # (no program per leaf shape)
    return TrainState(params=tree["params"], target_params=tree["target_params"], opt_state=tree["opt_state"],
                      step=tree["step"], key=jax.random.wrap_key_data(tree["key"]))
