"""MTRouter-style baseline (Sec. 2, 5.1): a per-turn router from supervised outcome and cost estimators.

    z(s, m)          = a(h_t, g(e_m, x_m, mask))         RIVET's card projector + state adapter, own parameters
    score_hat(s, m)  = sigmoid(f_score(z(s, m)))         E[outcome y | call m now], BCE on y (soft if graded)
    cost_hat(s, m)   = f_cost(z(s, m))                   cost from this turn to the end / mean episode cost, MSE
    Q(s, m)          = score_hat(s, m) - lambda cost_hat(s, m) x mean episode cost / c_ref
    route            = argmax_{m available} Q(s, m), at every turn

Plain supervised regression on the logged transitions: each logged turn is one example with the model actually
called, and its targets are read off its own episode (the final outcome, the summed cost of the remaining turns).
There is no bootstrapping, no response head and no CQL, so value is not propagated across turns: the estimators
learn what followed under the logging policy's continuation. h_t is the frozen encoder over RIVET's state text
(`serialize_state`: task + history, no model names), so the two routers see the same inputs.

lambda enters only at routing time, so one fit serves every lambda (`with_lam`). The cost term is in units of c_ref
(the corpus' mean per-turn cost, as in every other router's utility and in RIVET's reward, Eq. 1), so lambda means
the same price of a dollar for every router; the estimator regresses the normalised cost only to keep its target of
order one.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rivet_jax import checkpointing
from rivet_jax.data.cards import card_features, with_new_cards
from rivet_jax.data.replay import Replay, Reward, build_replay, reference_cost
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task
from rivet_jax.data.serialize import DEFAULT_MAX_TOKENS, TokenCounter, serialize_state
from rivet_jax.encoders import EmbeddingStore, Encoder
from rivet_jax.learner import make_optimizer
from rivet_jax.networks import CardProjector, StateAdapter, ValueHead, pad_rows
from rivet_jax.router_inputs import HistoryTurn, as_history, availability_mask
from rivet_jax.settings import Optim
from rivet_jax.sharding import epoch_batches

State = tuple[str, Sequence[HistoryTurn]]  # (task prompt, completed turns)


class MTRouterNet(nn.Module):
    """Outcome logits and normalised remaining cost for every state x candidate pair."""

    hidden: int = 128
    card_dim: int = 128
    head_hidden: int = 64

    def setup(self):
        self.card_projector = CardProjector(self.hidden, self.card_dim)
        self.state_adapter = StateAdapter(self.hidden)  # state path once per state, broadcast over the M cards
        self.score_head = ValueHead(self.head_hidden)
        self.cost_head = ValueHead(self.head_hidden)

    def __call__(self, h, cards):  # (B, D), card inputs -> (B, M) score logits, (B, M) cost_hat
        z = self.state_adapter(h, self.card_projector(*cards))  # (B, M, H)
        return self.score_head(z), self.cost_head(z)


# ------------------------------------------------------------------------------------------------- targets


def supervised_targets(episodes: Sequence[Episode], replay: Replay) -> tuple[np.ndarray, np.ndarray]:
    """Per transition of `replay` (built from `episodes`): the episode's outcome (N,) and its cost from this turn
    to the end, this turn included (N,), in USD."""
    cost_to_go = [np.cumsum([t.cost for t in episode.turns][::-1])[::-1] for episode in episodes]
    cost_to_go = np.concatenate(cost_to_go)  # build_replay flattens episodes in order, turns in order
    if cost_to_go.shape[0] != len(replay):
        raise ValueError(f"replay has {len(replay)} transitions but the episodes {cost_to_go.shape[0]} turns")
    outcome = np.array([episode.outcome for episode in episodes], np.float64)[replay.episode]
    return outcome, cost_to_go


def mean_episode_cost(episodes: Sequence[Episode]) -> float:
    """The cost normaliser: mean total cost of an episode, so a normalised cost_hat is of order one."""
    value = float(np.mean([sum(t.cost for t in episode.turns) for episode in episodes]))
    if not (value > 0 and np.isfinite(value)):
        raise ValueError(f"cannot normalise costs: the mean episode cost of this corpus is {value}")
    return value


# ------------------------------------------------------------------------------------------------ training


@flax.struct.dataclass
class FitData:
    """What an update reads, on device. T texts of width D, M candidates, F card fields, N transitions."""

    embeddings: jax.Array  # (T, D) float32 state and card-description vectors
    card_text: jax.Array   # (M,) int32 rows of the card descriptions
    card_x: jax.Array      # (M, F) float32
    card_mask: jax.Array   # (M, F) float32
    state: jax.Array       # (N,) int32 row of s_t
    action: jax.Array      # (N,) int32 the logged model
    outcome: jax.Array     # (N,) float32 the episode's final outcome in [0, 1]: BCE's (soft) target
    cost_to_go: jax.Array  # (N,) float32 remaining cost / mean episode cost

    @property
    def num_transitions(self) -> int:
        return int(self.state.shape[0])

    def cards(self):
        return self.embeddings[self.card_text], self.card_x, self.card_mask


@flax.struct.dataclass
class FitState:
    params: Any
    opt_state: Any
    key: jax.Array  # typed PRNG key; epoch e shuffles with fold_in(key, e)


def _batch_loss(params, data: FitData, idx, *, net: MTRouterNet):
    """BCE on the outcome plus squared error on the normalised remaining cost, both at the logged model."""
    h = data.embeddings[data.state[idx]]                                              # (B, D)
    logits, cost_hat = net.apply({"params": params}, h, data.cards())                 # (B, M), (B, M)
    action = data.action[idx][:, None]                                                # (B, 1)
    logit_taken = jnp.take_along_axis(logits, action, axis=1)[:, 0]                   # (B,)
    cost_taken = jnp.take_along_axis(cost_hat, action, axis=1)[:, 0]                  # (B,)
    bce = jnp.mean(optax.sigmoid_binary_cross_entropy(logit_taken, data.outcome[idx]))
    # Squared error, not Huber: the target is a conditional mean, and expensive episodes sit far above 1.
    mse = jnp.mean(jnp.square(cost_taken - data.cost_to_go[idx]))
    loss = bce + mse
    return loss, {"loss": loss, "score_bce": bce, "cost_mse": mse}


def make_fit_epoch(net: MTRouterNet, tx, batch_size: int):
    """jit'ed (state, data, epoch) -> (state, per-step metrics), the state donated; one `lax.scan` per epoch."""
    grad_fn = jax.value_and_grad(functools.partial(_batch_loss, net=net), has_aux=True)

    def fit_step(state: FitState, data: FitData, idx):
        (_, metrics), grads = grad_fn(state.params, data, idx)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state), metrics

    @functools.partial(jax.jit, donate_argnums=0)
    def fit_epoch(state: FitState, data: FitData, epoch: jax.Array):
        batches = epoch_batches(jax.random.fold_in(state.key, epoch), data.num_transitions, batch_size)
        return jax.lax.scan(lambda s, idx: fit_step(s, data, idx), state, batches)

    return fit_epoch


def _fit_data(episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, count_tokens: TokenCounter,
              max_tokens: int) -> tuple[FitData, float]:
    # The replay is used for its state texts, text table and actions only; its rewards are RIVET's and unused.
    replay = build_replay(episodes, pool, count_tokens=count_tokens, max_tokens=max_tokens,
                          reward=Reward(0.0, 1.0, 1.0))
    outcome, cost_to_go = supervised_targets(episodes, replay)
    scale = mean_episode_cost(episodes)
    # Embed only what the estimators read (states and cards), not the responses.
    rows = np.unique(np.concatenate([replay.state, replay.card_text]))
    row_of = np.full(len(replay.texts), -1, np.int32)
    row_of[rows] = np.arange(len(rows), dtype=np.int32)
    embeddings = store.embed([replay.texts[i] for i in rows])                       # (T, D)
    card_x, card_mask = card_features(pool)
    data = FitData(embeddings=jnp.asarray(embeddings, jnp.float32), card_text=jnp.asarray(row_of[replay.card_text]),
                   card_x=jnp.asarray(card_x), card_mask=jnp.asarray(card_mask),
                   state=jnp.asarray(row_of[replay.state]), action=jnp.asarray(replay.action),
                   outcome=jnp.asarray(outcome, jnp.float32), cost_to_go=jnp.asarray(cost_to_go / scale, jnp.float32))
    return data, scale


# ------------------------------------------------------------------------------------------------- routing


class MTRouter:
    """A `Policy`: at every turn the available model with the largest score_hat - lam * cost_hat (in c_ref units)."""

    name = "mtrouter"

    def __init__(self, net: MTRouterNet, params: Any, pool: ModelPool, encoder: Encoder,
                 card_embeddings: np.ndarray, *, lam: float, count_tokens: TokenCounter,
                 max_tokens: int = DEFAULT_MAX_TOKENS, episode_cost: float = 1.0, c_ref: float = 1.0,
                 history: Sequence[dict] = (), capability_names: tuple[str, ...] | None = None):
        self.pool = pool
        self.encoder = encoder
        self.lam = float(lam)
        self.count_tokens = count_tokens
        self.max_tokens = max_tokens
        self.episode_cost = episode_cost  # USD per unit of cost_hat: the training corpus' mean episode cost
        self.c_ref = c_ref                # USD per unit of cost in Q: the reference cost of Eq. 1
        self.history = list(history)      # per-epoch mean losses of the fit
        self.params = params
        self._net = net
        self._card_embeddings = card_embeddings
        # The card flags the estimators were fitted to read (a router with new models keeps them).
        self._capability_names = pool.capability_names if capability_names is None else capability_names
        card_x, card_mask = card_features(pool, self._capability_names)
        self._cards = (jnp.asarray(card_embeddings, jnp.float32), jnp.asarray(card_x), jnp.asarray(card_mask))

    @classmethod
    def fit(cls, episodes: Sequence[Episode], pool: ModelPool, store: EmbeddingStore, *, lam: float,
            count_tokens: TokenCounter | None = None, max_tokens: int = DEFAULT_MAX_TOKENS, hidden: int = 128,
            card_dim: int = 128, head_hidden: int = 64, epochs: int = 20, batch_size: int = 64, lr: float = 3e-4,
            weight_decay: float = 0.01, clip_norm: float = 5.0, seed: int = 42,
            c_ref: float | None = None) -> "MTRouter":
        """Fits both estimators on every logged turn of `episodes`; `count_tokens` defaults to the store's encoder.

        `lam` and `c_ref` (default: the corpus' mean per-turn cost, `data.replay.reference_cost`) are only stored
        for routing: the fit itself depends on neither.
        """
        count_tokens = count_tokens or store.encoder.count_tokens
        data, scale = _fit_data(episodes, pool, store, count_tokens, max_tokens)
        net = MTRouterNet(hidden=hidden, card_dim=card_dim, head_hidden=head_hidden)
        tx = make_optimizer(Optim(lr=lr, weight_decay=weight_decay, clip_norm=clip_norm))
        key = jax.random.key(seed)
        params = jax.jit(net.init)(jax.random.fold_in(key, 0), data.embeddings[:1], data.cards())["params"]
        state = FitState(params=params, opt_state=jax.jit(tx.init)(params), key=jax.random.fold_in(key, 1))
        fit_epoch = make_fit_epoch(net, tx, batch_size)
        history = []
        for epoch in range(epochs):
            state, metrics = fit_epoch(state, data, jnp.asarray(epoch, jnp.int32))
            record = {k: float(np.mean(v)) for k, v in jax.device_get(metrics).items()}
            if not np.isfinite(record["loss"]):
                raise checkpointing.NonFiniteError(f"mtrouter: non-finite loss {record['loss']} in epoch {epoch + 1}")
            history.append(record)
        return cls(net, state.params, pool, store.encoder, np.asarray(data.cards()[0]), lam=lam,
                   count_tokens=count_tokens, max_tokens=max_tokens, episode_cost=scale,
                   c_ref=reference_cost(episodes) if c_ref is None else c_ref, history=history)

    def with_new_models(self, cards: Sequence[ModelCard]) -> "MTRouter":
        """These estimators over the pool plus `cards`: models never seen logged, scored from their cards alone
        (as `Router.with_new_models`)."""
        pool, embeddings = with_new_cards(self.pool, self._card_embeddings, cards, self.encoder)
        return MTRouter(self._net, self.params, pool, self.encoder, embeddings, lam=self.lam,
                        count_tokens=self.count_tokens, max_tokens=self.max_tokens, episode_cost=self.episode_cost,
                        c_ref=self.c_ref, history=self.history, capability_names=self._capability_names)

    def with_lam(self, lam: float) -> "MTRouter":
        """The same estimators routing with another cost coefficient (no refit needed)."""
        other = copy.copy(self)
        other.lam = float(lam)
        return other

    # ------------------------------------------------------------------------------------------------ scoring

    def state_text(self, task: str, history: Sequence[HistoryTurn]) -> str:
        return serialize_state(task, as_history(history), self.count_tokens, self.max_tokens)

    def available_mask(self, available: Sequence[str] | None) -> np.ndarray:
        return availability_mask(self.pool, available)

    def predict_from_embeddings(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """score_hat (B, M) in [0, 1] and normalised cost_hat (B, M) for state embeddings (B, D)."""
        h = np.asarray(h, np.float32)
        prob, cost = _forward(self._net, self.params, jnp.asarray(pad_rows(h)), self._cards)
        return np.asarray(prob)[:len(h)], np.asarray(cost)[:len(h)]

    def predict(self, states: Sequence[State]) -> tuple[np.ndarray, np.ndarray]:
        """score_hat (B, M) and cost_hat (B, M) (x `episode_cost` for USD) for (task, history) pairs."""
        texts = [self.state_text(task, history) for task, history in states]
        return self.predict_from_embeddings(self.encoder.encode(texts))

    def scores(self, states: Sequence[State], available: Sequence[Sequence[str] | None] | None = None) -> np.ndarray:
        """Q (B, M) = score_hat - lam * cost_hat in units of c_ref, -inf for unavailable models; one availability
        list per state."""
        prob, cost = self.predict(states)
        q = prob - self.lam * cost * (self.episode_cost / self.c_ref)
        if available is not None:
            mask = np.stack([self.available_mask(a) for a in available])
            q = np.where(mask, q, -np.inf)
        return q

    def act(self, task: Task, history: Sequence[HistoryTurn], available: Sequence[str],
            rng: np.random.Generator) -> tuple[str, float]:
        """The `Policy` interface: deterministic argmax, propensity 1."""
        q = self.scores([(task.prompt, history)], [list(available)])[0]
        return self.pool.names[int(np.argmax(q))], 1.0

    def act_batch(self, requests) -> list[tuple[str, float]]:
        """Many `act`s in one encoder pass and one network call (batched rollouts, `envs.base.run_episodes`)."""
        q = self.scores([(task.prompt, history) for task, history, _, _ in requests],
                        [list(available) for _, _, available, _ in requests])      # (B, M)
        return [(self.pool.names[int(np.argmax(row))], 1.0) for row in q]


@functools.partial(jax.jit, static_argnums=0)
def _forward(net: MTRouterNet, params: Any, h: jax.Array, cards) -> tuple[jax.Array, jax.Array]:
    logits, cost_hat = net.apply({"params": params}, h, cards)
    return jax.nn.sigmoid(logits), cost_hat
