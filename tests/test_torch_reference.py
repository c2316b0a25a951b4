"""The PyTorch reference computes what the JAX update computes: same loss, metrics, gradients and parameters after
a few optimizer steps (with a target sync), from identical weights on an identical batch. Skipped without torch."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is optional: only the PyTorch reference benchmark uses it")

from configs import default  # noqa: E402
from rivet_jax.bench import torch_reference as ref  # noqa: E402
from rivet_jax.bench.benchmark import synthetic_data, synthetic_pool  # noqa: E402
from rivet_jax.corpus import gather_batch  # noqa: E402
from rivet_jax.learner import make_optimizer, template_state  # noqa: E402
from rivet_jax.losses import rivet_loss  # noqa: E402
from rivet_jax.networks import make_network  # noqa: E402
from rivet_jax.engine import make_train_step  # noqa: E402
from rivet_jax.settings import Optim  # noqa: E402


def _config(target_sync_steps: int = 2):
    config = default.get_config("tiny")
    config.target_sync_steps = target_sync_steps
    return config


def _data(config, num_transitions: int = 40, num_models: int = 4):
    """Synthetic data with some models unavailable (now and next), so every masked max/argmax/logsumexp matters."""
    pool = synthetic_pool(num_models)
    data = synthetic_data(num_transitions, config.encoder.dim, pool, seed=3)
    rng = np.random.default_rng(7)
    replay = dict(data.replay)
    for key in ("available", "next_available"):
        mask = rng.random((num_transitions, num_models)) < 0.7
        mask[np.arange(num_transitions), rng.integers(0, num_models, num_transitions)] = True  # >= 1 available
        replay[key] = jnp.asarray(mask)
    # the logged action is available when taken
    replay["available"] = replay["available"].at[jnp.arange(num_transitions), replay["action"]].set(True)
    return pool, dataclasses.replace(data, replay=replay)


def _setup(config, stage: str = "td"):
    pool, data = _data(config)
    net, tx = make_network(config), make_optimizer(Optim.of(config))
    state = template_state(config.seed, net, tx, config.encoder.dim, pool, stage)
    # A target different from the online net, so the Double-DQN target reads both.
    state = state.replace(target_params=jax.tree.map(lambda p: p * 0.9 + 0.01, state.params))
    trainer = ref.Trainer(config, state.params, config.encoder.dim, int(data.card_x.shape[1]), stage)
    ref.load_flax_params(trainer.target_net, state.target_params)
    return net, tx, state, data, trainer


def _assert_trees_close(actual: dict, expected, rtol: float, atol: float):
    expected = jax.tree.map(np.asarray, expected)
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for path, a in jax.tree_util.tree_leaves_with_path(actual):
        e = expected
        for key in path:
            e = e[key.key]
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


def test_params_round_trip():
    config = _config()
    _, _, state, _, trainer = _setup(config)
    _assert_trees_close(ref.flax_params(trainer.net), state.params, rtol=0, atol=0)


def test_module_imports_without_torch_machinery():
    assert ref.available() and ref.missing_reason("torch") is None
    assert "not installed" in ref.missing_reason("surely_not_a_module_here")


@pytest.mark.parametrize("stage", ["td", "mc"])
def test_loss_metrics_and_gradients_match_jax(stage):
    config = _config()
    net, _, state, data, trainer = _setup(config, stage)
    idx = np.arange(config.optim.batch_size) * 2 % data.num_transitions
    batch = gather_batch(data, jnp.asarray(idx, jnp.int32))
    loss_fn = functools.partial(rivet_loss, net=net, config=config, stage=stage)
    (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
        state.params, state.target_params, batch, data.cards())  # jit: eager dispatch of each op is slower

    tdata = ref.to_torch_data(data)
    t_loss, t_metrics = trainer.loss(ref.gather_batch(tdata, torch.from_numpy(idx)), ref.cards(tdata))
    t_loss.backward()
    assert float(loss) != 0.0
    np.testing.assert_allclose(float(t_loss.detach()), float(loss), rtol=1e-5, atol=1e-6)
    assert set(t_metrics) == set(metrics)
    for key, value in metrics.items():
        np.testing.assert_allclose(float(t_metrics[key]), float(value), rtol=1e-5, atol=1e-6, err_msg=key)
    _assert_trees_close(ref.flax_grads(trainer.net), grads, rtol=1e-4, atol=1e-6)


def test_three_updates_with_target_sync_match_jax():
    config = _config(target_sync_steps=2)
    # A strong decay, so that where and how AdamW decays shows above float32 noise (~3e-7 here) within 3 steps.
    config.optim.weight_decay = 0.5
    net, tx, state, data, trainer = _setup(config)
    step = jax.jit(make_train_step(net, tx, config, "td"))
    tdata = ref.to_torch_data(data)
    batch_size = config.optim.batch_size
    for i in range(3):
        idx = np.arange(i * batch_size, (i + 1) * batch_size) % data.num_transitions
        state, metrics = step(state, data, jnp.asarray(idx, jnp.int32))
        t_metrics = trainer.update(ref.gather_batch(tdata, torch.from_numpy(idx)), ref.cards(tdata))
        for key in ("loss", "grad_norm", "target"):
            np.testing.assert_allclose(float(t_metrics[key]), float(metrics[key]), rtol=1e-4, atol=1e-5,
                                       err_msg=f"step {i + 1} {key}")
    assert trainer.step == int(state.step) == 3
    _assert_trees_close(ref.flax_params(trainer.net), state.params, rtol=0, atol=2e-5)
    # synced at step 2, so the target is the step-2 online net on both sides (not the initial, shifted one)
    _assert_trees_close(ref.flax_params(trainer.target_net), state.target_params, rtol=0, atol=2e-5)


def test_clipping_engages_like_optax():
    """A clip norm below the gradient norm: both sides rescale to it before AdamW."""
    config = _config()
    config.optim.clip_norm = 1e-3
    net, tx, state, data, trainer = _setup(config)
    step = jax.jit(make_train_step(net, tx, config, "td"))
    tdata = ref.to_torch_data(data)
    idx = np.arange(config.optim.batch_size)
    for _ in range(2):
        state, metrics = step(state, data, jnp.asarray(idx, jnp.int32))
        t_metrics = trainer.update(ref.gather_batch(tdata, torch.from_numpy(idx)), ref.cards(tdata))
    assert float(metrics["grad_norm"]) > 100 * config.optim.clip_norm
    np.testing.assert_allclose(float(t_metrics["grad_norm"]), float(metrics["grad_norm"]), rtol=1e-4)
    _assert_trees_close(ref.flax_params(trainer.net), state.params, rtol=0, atol=1e-4)


def test_benchmark_update_runs_on_tiny_sizes():
    config = _config()
    pool, data = _data(config)
    result = ref.benchmark_update(config, data, pool, steps=4)
    assert result["steps_per_s"] > 0 and result["threads"] >= 1 and np.isfinite(result["final_loss"])
    assert result["torch"] == torch.__version__


def test_reference_minilm_reports_or_skips():
    result = ref.reference_minilm_throughput(["a short text", "another one here"] * 5, batch_size=4)
    assert ("texts_per_s" in result and result["texts_per_s"] > 0) or result["skipped"]
