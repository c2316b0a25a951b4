"""RVE and RIVE over one shared state-model representation (Sec. 4.1, App. B.3), in flax.linen.

    z_m        = g(e_m, x_m, mask)              card projector                     (M, card_dim)
    z(s, m)    = a(h_t, z_m)                    state adapter                      (B, M, hidden)
    z(s, m; l) = (1 + a(l)) z(s, m) + b(l)      lambda FiLM (lambda-conditioned)   (B, M, hidden)
    Q_route    = f_route(z(s, m))               RVE head, deployed                 (B, M)
    Q_resp     = f_resp(z(s, m_t), p(e(o_t)))   RIVE head + response projector p   (B,)

The adapter's first layer is linear in [h; z_m], so it splits into W_h h + W_z z_m: the state path (the large
D x hidden matmul) runs once per state and is broadcast over the M candidates, never once per (state, model) pair.
The card projector and the adapter are shared; the two heads have separate parameters. Deployment needs only
`card_projector`, `state_adapter` and `route_head` (see `RVE_MODULES`), and `lambda_film` when the network is
lambda-conditioned: one run then values every trade-off between success and cost, lambda being an input (FiLM on
the shared representation, so both heads see it) instead of a constant of the rewards.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rivet_jax.data.cards import CARD_INPUTS, input_columns

RVE_MODULES = ("card_projector", "state_adapter", "route_head")
FILM_MODULE = "lambda_film"  # read by q_route too, in a lambda-conditioned network
# The lambda scale of the conditioning features: lambda is in units of c_ref (one mean turn), where 0.01 already
# moves a 15-turn episode's J by 0.15.
LAMBDA_SCALE = 0.01


class CardProjector(nn.Module):
    """g(e_m, x_m, mask) -> z_m: card text embedding plus structured fields and which of them are known."""

    hidden: int
    card_dim: int
    inputs: tuple[str, ...] = CARD_INPUTS  # the card groups read; the others enter as zeros (fields as unknown)

    @nn.compact
    def __call__(self, e_m, x_m, mask):  # (M, D), (M, F), (M, F) -> (M, card_dim)
        if self.inputs != CARD_INPUTS:  # an ablation: the parameters keep their shapes
            keep = jnp.asarray(input_columns(self.inputs, x_m.shape[-1]))             # (F,)
            e_m = e_m if "description" in self.inputs else jnp.zeros_like(e_m)
            x_m, mask = x_m * keep, mask * keep
        inputs = jnp.concatenate([e_m, x_m * mask, mask], axis=-1)
        hidden = nn.gelu(nn.Dense(self.hidden, name="in")(inputs))
        return nn.Dense(self.card_dim, name="out")(hidden)


class StateAdapter(nn.Module):
    """a(h_t, z_m) -> z(s_t, m) for every state x candidate pair."""

    hidden: int

    @nn.compact
    def __call__(self, h, z_m):  # (B, D), (M, C) -> (B, M, hidden)
        state_part = nn.Dense(self.hidden, name="state")(h)                    # (B, H), once per state
        card_part = nn.Dense(self.hidden, use_bias=False, name="card")(z_m)    # (M, H), once per card
        fused = nn.gelu(state_part[:, None, :] + card_part[None, :, :])        # (B, M, H)
        fused = nn.LayerNorm(name="norm")(fused)
        return nn.gelu(nn.Dense(self.hidden, name="out")(fused))


def lambda_features(lam):  # (B,) -> (B, 2)
    """lambda as the network reads it: itself and log(1 + lambda / LAMBDA_SCALE), which spreads the small lambdas
    where the trade-off turns (lambda 0 to 0.05) as widely as the large ones."""
    lam = jnp.asarray(lam, jnp.float32)
    return jnp.stack([lam, jnp.log1p(lam / LAMBDA_SCALE)], axis=-1)


class LambdaFiLM(nn.Module):
    """z(s, m; lambda) = (1 + scale(lambda)) z(s, m) + shift(lambda): the same modulation for every candidate."""

    hidden: int

    @nn.compact
    def __call__(self, z, lam):  # (B, M, H), (B,) -> (B, M, H)
        hidden = nn.gelu(nn.Dense(self.hidden, name="in")(lambda_features(lam)))         # (B, H)
        scale, shift = jnp.split(nn.Dense(2 * z.shape[-1], name="out")(hidden), 2, axis=-1)
        return z * (1.0 + scale[:, None, :]) + shift[:, None, :]


class ValueHead(nn.Module):
    """A small MLP from features to one scalar value."""

    hidden: int

    @nn.compact
    def __call__(self, z):  # (..., F) -> (...)
        return nn.Dense(1, name="out")(nn.gelu(nn.Dense(self.hidden, name="in")(z)))[..., 0]


class ResponseProjector(nn.Module):
    """e(o_t): the frozen response embedding through a trainable projection."""

    hidden: int
    out: int

    @nn.compact
    def __call__(self, e_o):  # (B, D) -> (B, out)
        return nn.Dense(self.out, name="out")(nn.gelu(nn.Dense(self.hidden, name="in")(e_o)))


class RivetNet(nn.Module):
    """Both estimators. `__call__` is only for `init`; use the named methods with `apply(..., method=...)`."""

    hidden: int = 128
    card_dim: int = 128
    head_hidden: int = 64
    response_dim: int = 64
    card_inputs: tuple[str, ...] = CARD_INPUTS
    lambda_conditioned: bool = False  # lambda an input (`lam`, (B,)); else the network ignores it

    def setup(self):
        self.card_projector = CardProjector(self.hidden, self.card_dim, self.card_inputs)
        self.state_adapter = StateAdapter(self.hidden)
        self.route_head = ValueHead(self.head_hidden)
        self.response_projector = ResponseProjector(self.hidden, self.response_dim)
        self.resp_head = ValueHead(self.head_hidden)
        if self.lambda_conditioned:
            self.lambda_film = LambdaFiLM(self.head_hidden)

    def representation(self, h, cards, lam=None):  # (B, D), card inputs, (B,) -> (B, M, hidden)
        z = self.state_adapter(h, self.card_projector(*cards))
        return self.lambda_film(z, lam) if self.lambda_conditioned else z

    def q_route(self, h, cards, lam=None):  # (B, D) -> (B, M)
        """Q_route(s, m) for every candidate (Eq. 4): pre-call information only."""
        return self.route_head(self.representation(h, cards, lam))

    def q_both(self, h, cards, action, e_o, lam=None):  # (B, D), (B,), (B, D) -> (B, M), (B,)
        """Q_route for every candidate and Q_resp(s, m_t, o_t) for the executed one (Eq. 6), sharing z."""
        z = self.representation(h, cards, lam)                                   # (B, M, H)
        z_taken = jnp.take_along_axis(z, action[:, None, None], axis=1)[:, 0]   # (B, H)
        q_resp = self.resp_head(jnp.concatenate([z_taken, self.response_projector(e_o)], axis=-1))
        return self.route_head(z), q_resp

    def __call__(self, h, cards, action, e_o):
        return self.q_both(h, cards, action, e_o, jnp.zeros(h.shape[:1]) if self.lambda_conditioned else None)


def make_network(config: Any) -> RivetNet:
    """The network from `config.model` (hidden, card_dim, head_hidden, response_dim, card_inputs: every card input
    where a config, e.g. an older checkpoint's, has none)."""
    return RivetNet(hidden=config.model.hidden, card_dim=config.model.card_dim,
                    head_hidden=config.model.head_hidden, response_dim=config.model.response_dim,
                    card_inputs=tuple(config.model.get("card_inputs", CARD_INPUTS)),
                    lambda_conditioned=lambda_conditioned(config))


def lambda_conditioned(config: Any) -> bool:
    """Whether `config`'s runs draw lambda per transition (`reward.lam_range`: (low, high)) and take it as an input."""
    return len(config.reward.get("lam_range", ())) == 2


def init_params(net: RivetNet, key: jax.Array, state_dim: int, cards) -> dict:
    """Parameters of both estimators for state/response embeddings of width `state_dim`."""
    return _jit_init(net, key, jnp.zeros((1, state_dim), jnp.float32), cards)


# flax's Dense default, LeCun normal: a normal truncated to +-2 std, rescaled to variance 1 / fan_in.
_TRUNCATED_NORMAL_STD = 0.87962566103423978  # std of a standard normal truncated to [-2, 2]


@functools.partial(jax.jit, static_argnums=0)
def _jit_init(net: RivetNet, key: jax.Array, h: jax.Array, cards) -> dict:
    """flax's default initialisation (LeCun-normal Dense kernels, zero biases, unit LayerNorm scales), with every
    kernel cut from one truncated-normal draw: XLA compiles each random draw separately (about 35 ms apiece on a
    CPU), so one draw instead of one per kernel saves about a second of every run's start."""
    shapes = jax.eval_shape(net.init, key, h, cards, jnp.zeros((1,), jnp.int32), h)["params"]
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    kernels = [leaf for path, leaf in leaves if path[-1].key == "kernel"]
    draw = jax.random.truncated_normal(key, -2.0, 2.0, (sum(k.size for k in kernels),), jnp.float32)
    values, offset = [], 0
    for path, leaf in leaves:
        name = path[-1].key
        if name == "kernel":  # (fan_in, fan_out)
            part = draw[offset:offset + leaf.size].reshape(leaf.shape)
            values.append(part / (_TRUNCATED_NORMAL_STD * jnp.sqrt(jnp.float32(leaf.shape[0]))))
            offset += leaf.size
        elif name in ("bias", "scale"):
            values.append(jnp.full(leaf.shape, 1.0 if name == "scale" else 0.0, leaf.dtype))
        else:
            raise ValueError(f"no initialiser for parameter {jax.tree_util.keystr(path)} (Dense and LayerNorm only)")
    return jax.tree_util.tree_unflatten(treedef, values)


def rve_params(params: dict) -> dict:
    """The deployable subset: what `q_route` reads."""
    return {name: params[name] for name in (*RVE_MODULES, FILM_MODULE) if name in params}


def pad_rows(x: np.ndarray, at_least: int = 1) -> np.ndarray:
    """`x` (B, ...) with zero rows appended up to a power of two, and to `at_least` rows (B = 1 kept): callers that
    score batches of every size (batched rollouts: fewer live episodes each round) then compile a handful of
    programs, not one per B. Cut the result back with `[:B]`."""
    rows = x.shape[0]
    padded = rows if rows <= 1 else max(1 << (rows - 1).bit_length(), at_least)
    return np.concatenate([x, np.zeros((padded - rows, *x.shape[1:]), x.dtype)]) if padded > rows else x
