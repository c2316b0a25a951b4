"""Speed of the training updates at the paper's sizes, and the wall time of a full offline run.

Encoding is excluded: the replay and the embedding table are random arrays of the right shapes (state dim 1024,
M = 6 candidates, 7,492 transitions by default), fed to exactly the update and epoch functions training uses.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rivet_jax.data.cards import card_features
from rivet_jax.data.schema import ModelCard, ModelPool
from rivet_jax.networks import make_network
from rivet_jax.train import TrainData, make_optimizer, make_train_epoch, init_train_state, make_train_step, template_state

PAPER_TRANSITIONS = 7_492


def synthetic_pool(num_models: int) -> ModelPool:
    return ModelPool(tuple(
        ModelCard(name=f"model-{i}", description=f"candidate {i}", context_length=8_192 * (i + 1),
                  price_in_per_mtok=0.1 * 3**i, price_out_per_mtok=0.3 * 3**i, capabilities=(("code", i % 2 == 0),))
        for i in range(num_models)))


def synthetic_data(num_transitions: int, state_dim: int, pool: ModelPool, seed: int = 0) -> TrainData:
    """A replay of the given size over random unit embeddings; every text distinct, as in real logs."""
    rng = np.random.default_rng(seed)
    n, m = num_transitions, len(pool)
    num_texts = 2 * n + m  # states (next states share them), responses, card descriptions
    embeddings = rng.normal(size=(num_texts, state_dim)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    state = rng.integers(0, n, n).astype(np.int32)
    done = (rng.random(n) < 0.25).astype(np.float32)
    replay = {
        "state": state, "next_state": np.minimum(state + 1, n - 1).astype(np.int32),
        "response": (n + np.arange(n)).astype(np.int32), "action": rng.integers(0, m, n).astype(np.int32),
        "reward": (-0.05 * rng.random(n) + done * (rng.random(n) < 0.7)).astype(np.float32), "done": done,
        "mc_return": rng.random(n).astype(np.float32), "available": np.ones((n, m), bool),
        "next_available": np.ones((n, m), bool),
    }
    card_x, card_mask = card_features(pool)
    return TrainData(embeddings=jnp.asarray(embeddings), card_text=jnp.arange(2 * n, 2 * n + m, dtype=jnp.int32),
                     card_x=jnp.asarray(card_x), card_mask=jnp.asarray(card_mask),
                     replay={k: jnp.asarray(v) for k, v in replay.items()})


def _block(tree):
    return jax.block_until_ready(tree)


def _time_single_steps(config, net, tx, data, stage: str, pool, steps: int) -> dict:
    """Steps/s of the jit'ed single update, called from Python once per step."""
    state = template_state(config, net, tx, data.embeddings.shape[1], pool, stage)
    step = jax.jit(make_train_step(net, tx, config, stage), donate_argnums=0)
    batch_size = config.optim.batch_size
    batches = [jnp.arange(i * batch_size, (i + 1) * batch_size, dtype=jnp.int32) % data.num_transitions
               for i in range(steps)]
    started = time.perf_counter()
    state, _ = _block(step(state, data, batches[0]))
    compile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    for idx in batches[1:]:
        state, metrics = step(state, data, idx)
    _block(metrics)
    return {"compile_s": compile_seconds, "steps_per_s": (steps - 1) / (time.perf_counter() - started)}


def _time_offline_training(config, net, tx, data, pool) -> dict:
    """Wall time of config.mc_epochs MC + config.td_epochs TD epochs through the scanned epoch functions."""
    result = {}
    started = time.perf_counter()
    state = template_state(config, net, tx, data.embeddings.shape[1], pool, "mc")
    for stage, epochs in (("mc", config.mc_epochs), ("td", config.td_epochs)):
        if stage == "td":
            state = init_train_state(net, tx, state.params, state.key)
        train_epoch = make_train_epoch(net, tx, config, stage)
        stage_started = time.perf_counter()
        state, metrics, _ = _block(train_epoch(state, data, jnp.int32(0)))
        first_epoch = time.perf_counter() - stage_started
        steps_per_epoch = int(metrics["loss"].shape[0])
        warm_started = time.perf_counter()
        for epoch in range(1, epochs):
            state, metrics, _ = train_epoch(state, data, jnp.int32(epoch))
        _block(metrics)
        warm = time.perf_counter() - warm_started
        result[stage] = {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "first_epoch_s": first_epoch,
                         "scan_steps_per_s": steps_per_epoch * (epochs - 1) / warm if epochs > 1 else None,
                         "final_loss": float(metrics["loss"][-1])}
    result["total_s"] = time.perf_counter() - started
    return result


def run_benchmark(config: ml_collections.ConfigDict, num_transitions: int = PAPER_TRANSITIONS,
                  num_models: int = 6, single_steps: int = 200) -> dict:
    """Measures everything; returns a JSON-ready dict."""
    pool = synthetic_pool(num_models)
    data = synthetic_data(num_transitions, config.encoder.dim, pool, seed=config.seed)
    net, tx = make_network(config), make_optimizer(config)
    return {
        "device": str(jax.devices()[0]), "backend": jax.default_backend(), "jax": jax.__version__,
        "sizes": {"transitions": num_transitions, "state_dim": config.encoder.dim, "models": num_models,
                  "card_dim": config.model.card_dim, "hidden": config.model.hidden,
                  "batch": config.optim.batch_size},
        "single_step": {stage: _time_single_steps(config, net, tx, data, stage, pool, single_steps)
                        for stage in ("mc", "td")},
        "offline_training": _time_offline_training(config, net, tx, data, pool),
    }


def format_table(result: dict) -> str:
    single, offline = result["single_step"], result["offline_training"]
    rows = [("MC update, jit per step", f"{single['mc']['steps_per_s']:.0f} steps/s",
             f"compile {single['mc']['compile_s']:.2f}s"),
            ("TD+CQL update, jit per step", f"{single['td']['steps_per_s']:.0f} steps/s",
             f"compile {single['td']['compile_s']:.2f}s"),
            ("MC epoch in lax.scan", f"{offline['mc']['scan_steps_per_s'] or float('nan'):.0f} steps/s",
             f"first epoch (with compile) {offline['mc']['first_epoch_s']:.2f}s"),
            ("TD+CQL epoch in lax.scan", f"{offline['td']['scan_steps_per_s'] or float('nan'):.0f} steps/s",
             f"first epoch (with compile) {offline['td']['first_epoch_s']:.2f}s"),
            (f"offline training {offline['mc']['epochs']} MC + {offline['td']['epochs']} TD epochs",
             f"{offline['total_s']:.2f} s", "wall time, compile included, encoding excluded")]
    sizes = result["sizes"]
    header = (f"RIVET update benchmark on {result['device']} ({result['backend']}, jax {result['jax']}); "
              f"{sizes['transitions']} transitions, D={sizes['state_dim']}, M={sizes['models']}, "
              f"batch {sizes['batch']}")
    width = max(len(r[0]) for r in rows)
    return "\n".join([header] + [f"  {name:<{width}}  {value:>16}  {note}" for name, value, note in rows])


def write_json(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
