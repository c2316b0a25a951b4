"""Speed of the training updates at the paper's sizes, the wall time of a full offline run, the TD+CQL update's
achieved FLOP/s against a large matmul measured in the same run, the latency of one routing decision, and the main
job's seconds and peak memory per phase on a reduced manifest (`main_job.py`).

Encoding is excluded: the replay and the embedding table are random arrays of the right shapes (state dim 1024,
M = 6 candidates, 7,492 transitions by default), fed to exactly the update and epoch functions training uses.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rivet_jax.bench.main_job import main_job_rows, run_main_job
from rivet_jax.bench.run_groups import run_group_rows, run_group_throughput
from rivet_jax.corpus import TrainData, gather_batch
from rivet_jax.data.cards import card_features
from rivet_jax.data.schema import ModelCard, ModelPool
from rivet_jax.engine import make_group_chunk, make_group_epoch, make_train_step
from rivet_jax.learner import init_train_state, make_optimizer, run_values, stack, template_state, unstack
from rivet_jax.networks import make_network
from rivet_jax.settings import LossWeights, Optim
from rivet_jax.sharding import global_batches, make_mesh

PAPER_TRANSITIONS = 7_492
REPEATS = 3  # scaling points: the median of this many timed runs (a shared machine's noise is one-sided)


def synthetic_pool(num_models: int) -> ModelPool:
    return ModelPool(tuple(
        ModelCard(name=f"model-{i}", description=f"candidate {i}", context_length=8_192 * (i + 1),
                  price_in_per_mtok=0.1 * 3**i, price_out_per_mtok=0.3 * 3**i, capabilities=(("code", i % 2 == 0),))
        for i in range(num_models)))


def synthetic_data(num_transitions: int, state_dim: int, pool: ModelPool, seed: int = 0,
                   directory: str | Path | None = None) -> TrainData:
    """A replay of the given size over random unit embeddings; every text distinct, as in real logs.

    With `directory` the embedding table is written there as a `.npy` file (chunk by chunk, so its size is not
    bounded by memory) and the data is host-resident, memory-mapped: what `config.data.embeddings_on_disk` trains
    from. Otherwise everything is on the device.
    """
    rng = np.random.default_rng(seed)
    n, m = num_transitions, len(pool)
    num_texts = 2 * n + m  # states (next states share them), responses, card descriptions
    if directory is None:
        embeddings = _unit_rows(rng, num_texts, state_dim)
    else:
        path = Path(directory) / f"synthetic-{num_texts}x{state_dim}-seed{seed}.npy"
        embeddings = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(num_texts, state_dim))
        for start in range(0, num_texts, 65_536):
            embeddings[start:start + 65_536] = _unit_rows(rng, min(65_536, num_texts - start), state_dim)
        embeddings.flush()
        embeddings = np.load(path, mmap_mode="r")
    state = rng.integers(0, n, n).astype(np.int32)
    done = (rng.random(n) < 0.25).astype(np.float32)
    replay = {
        "state": state, "next_state": np.minimum(state + 1, n - 1).astype(np.int32),
        "response": (n + np.arange(n)).astype(np.int32), "action": rng.integers(0, m, n).astype(np.int32),
        "reward": (-0.05 * rng.random(n) + done * (rng.random(n) < 0.7)).astype(np.float32), "done": done,
        "mc_return": rng.random(n).astype(np.float32), "available": np.ones((n, m), bool),
        "next_available": np.ones((n, m), bool), "stochastic": (rng.random(n) < 0.15).astype(np.float32),
        "cost": rng.random(n).astype(np.float32), "cost_return": rng.random(n).astype(np.float32),
        "lam": np.full(n, 0.05, np.float32),
    }
    card_x, card_mask = card_features(pool)
    put = jnp.asarray if directory is None else np.asarray  # the memory map itself stays as it is
    return TrainData(embeddings=embeddings if directory else put(embeddings),
                     card_text=put(np.arange(2 * n, 2 * n + m, dtype=np.int32)), card_x=put(card_x),
                     card_mask=put(card_mask), replay={k: put(v) for k, v in replay.items()})


def _unit_rows(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    vectors = rng.standard_normal((rows, dim), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _block(tree):
    return jax.block_until_ready(tree)


def _time_single_steps(config, net, tx, data, stage: str, pool, steps: int) -> dict:
    """Steps/s of the jit'ed single update, called from Python once per step."""
    state = template_state(config.seed, net, tx, data.embeddings.shape[1], pool, stage)
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
    """Wall time of config.mc_epochs MC + config.td_epochs TD epochs of one run (a group of one) through the
    engine's scanned epoch."""
    result = {}
    started = time.perf_counter()
    states = stack([template_state(config.seed, net, tx, data.embeddings.shape[1], pool, "mc")])
    values = run_values([LossWeights.of(config)], [data.replay])
    for stage, epochs in (("mc", config.mc_epochs), ("td", config.td_epochs)):
        if stage == "td":
            state = unstack(states, 0)
            states = stack([init_train_state(net, tx, state.params, state.key)])
        group_epoch = make_group_epoch(net, tx, config, stage)
        stage_started = time.perf_counter()
        states, metrics, _ = _block(group_epoch(states, data, values, jnp.int32(0)))
        first_epoch = time.perf_counter() - stage_started
        metrics = {k: v[0] for k, v in metrics.items()}                              # (1, S) -> (S,)
        steps_per_epoch = int(metrics["loss"].shape[0])
        warm_started = time.perf_counter()
        for epoch in range(1, epochs):
            states, metrics, _ = group_epoch(states, data, values, jnp.int32(epoch))
            metrics = {k: v[0] for k, v in metrics.items()}
        _block(metrics)
        warm = time.perf_counter() - warm_started
        result[stage] = {"epochs": epochs, "steps_per_epoch": steps_per_epoch, "first_epoch_s": first_epoch,
                         "scan_steps_per_s": steps_per_epoch * (epochs - 1) / warm if epochs > 1 else None,
                         "final_loss": float(metrics["loss"][-1])}
    result["total_s"] = time.perf_counter() - started
    return result


def _time_scanned_steps(config, net, tx, data, stage: str, pool, steps: int) -> dict:
    """Steps/s of `steps` updates on random batches in one jit'ed `lax.scan` over device-resident data, warm: the
    epoch function's loop, with the corpus size decoupled from the number of steps."""
    state = template_state(config.seed, net, tx, data.embeddings.shape[1], pool, stage)
    train_step = make_train_step(net, tx, config, stage)
    run = jax.jit(lambda s, d, b: jax.lax.scan(lambda s_, idx: train_step(s_, d, idx), s, b), donate_argnums=0)
    rng = np.random.default_rng(0)
    batches = jnp.asarray(rng.integers(0, data.num_transitions, (steps, config.optim.batch_size)), jnp.int32)
    state, metrics = _block(run(state, data, batches))  # compiles
    seconds = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        state, metrics = _block(run(state, data, batches))
        seconds.append(time.perf_counter() - started)
    return {"steps_per_s": steps / float(np.median(seconds))}


def _time_host_fed_steps(config, net, tx, data, stage: str, pool, steps: int) -> dict:
    """Steps/s of host-fed training (batches gathered with numpy from host-resident, e.g. memory-mapped, data and
    run `config.data.host_chunk_steps` per jit call) over random batches of the whole table, warm."""
    states = stack([template_state(config.seed, net, tx, data.embeddings.shape[1], pool, stage)])  # a group of one
    weights = run_values([LossWeights.of(config)], [data.replay]).weights
    group_chunk = make_group_chunk(net, tx, config, stage)
    cards = tuple(np.asarray(c, np.float32) for c in data.cards())
    mesh, chunk = make_mesh(1), config.data.host_chunk_steps
    rng = np.random.default_rng(0)
    # Fresh rows for every timed run: rows read before would be served from memory already mapped.
    batches = rng.integers(0, data.num_transitions, (chunk + REPEATS * steps, config.optim.batch_size))

    def run(states, rows):  # the engine's host-fed loop: K numpy-gathered batches per jit call
        for start in range(0, len(rows), chunk):
            local = jax.tree.map(lambda x: x[None], gather_batch(data, rows[start:start + chunk]))  # (1, K, B, ...)
            states, metrics = group_chunk(states, global_batches(local, mesh, batch_axis=2), cards, weights)
        return _block((states, metrics))

    states, _ = run(states, batches[:chunk])  # compiles
    seconds = []
    for start in range(chunk, len(batches), steps):
        started = time.perf_counter()
        states, _ = run(states, batches[start:start + steps])
        seconds.append(time.perf_counter() - started)
    return {"steps_per_s": steps / float(np.median(seconds))}


def update_matmul_flops(config, num_models: int, num_fields: int, stage: str = "td") -> float:
    """FLOPs of the matrix products in one update, counted analytically (2 m k n each; elementwise work, the
    optimizer and the gathers not counted, as is usual for model FLOP utilisation).

    Forward: the online net on h_t (every candidate, plus RIVE on the taken one); for TD also the online and the
    target nets' Q_route on h_{t+1}. Backward, through the h_t pass only (the h_{t+1} passes are stop_gradient /
    target): a weight gradient for every product and an input gradient for every product whose input is computed
    (not for the layers that read the frozen embeddings).
    """
    b, d, m, f = config.optim.batch_size, config.encoder.dim, num_models, num_fields
    h, c, hh, r = config.model.hidden, config.model.card_dim, config.model.head_hidden, config.model.response_dim
    route = [(m, d + 2 * f, h, False), (m, h, c, True),                     # card projector g
             (b, d, h, False), (m, c, h, True), (b * m, h, h, True),        # state adapter a
             (b * m, h, hh, True), (b * m, hh, 1, True)]                    # RVE head
    rive = [(b, d, h, False), (b, h, r, True), (b, h + r, hh, True), (b, hh, 1, True)]  # response projector, RIVE
    def forward(products):
        return sum(2 * p * k * q for p, k, q, _ in products)

    def backward(products):
        return sum(2 * p * k * q * (2 if computed else 1) for p, k, q, computed in products)

    target_passes = 2 * forward(route) if stage == "td" else 0
    return float(forward(route + rive) + backward(route + rive) + target_passes)


def matmul_flops_per_s(size: int = 2048, repeats: int = 10) -> float:
    """The machine's practical limit: FLOP/s of a large float32 matmul, measured in this run."""
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    _block(matmul(a, a))
    started = time.perf_counter()
    for _ in range(repeats):
        out = matmul(a, a)
    _block(out)
    return 2 * size**3 * repeats / (time.perf_counter() - started)


def _update_flops(config, net, tx, data, stage: str, pool) -> float:
    """FLOPs of one update, as counted by XLA's cost analysis of the compiled step."""
    state = template_state(config.seed, net, tx, data.embeddings.shape[1], pool, stage)
    step = jax.jit(make_train_step(net, tx, config, stage))
    idx = jnp.arange(config.optim.batch_size, dtype=jnp.int32)
    analysis = step.lower(state, data, idx).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return float(analysis.get("flops", float("nan")))


def _routing_latency(config, net, tx, data, pool, calls: int = 2000, batch: int = 256) -> dict:
    """One decision (state embedding given, all candidates scored, argmax): p50/p99 in microseconds; and batched
    decisions per second."""
    from rivet_jax.encoders import HashingEncoder  # unused for scoring: embeddings are given
    from rivet_jax.router import Router

    state = template_state(config.seed, net, tx, data.embeddings.shape[1], pool, "td")
    router = Router(state.params, pool, HashingEncoder(dim=int(data.embeddings.shape[1])), config,
                    np.asarray(data.embeddings[data.card_text]))
    h = np.asarray(data.embeddings[:batch])
    router.scores_from_embeddings(h[:1]), router.scores_from_embeddings(h)  # compile both shapes
    times = []
    for i in range(calls):
        started = time.perf_counter()
        int(np.argmax(router.scores_from_embeddings(h[i % batch:i % batch + 1])[0]))
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(20):
        np.argmax(router.scores_from_embeddings(h), axis=1)
    batched = 20 * batch / (time.perf_counter() - started)
    micros = np.array(times) * 1e6
    return {"p50_us": float(np.percentile(micros, 50)), "p99_us": float(np.percentile(micros, 99)),
            "batched_decisions_per_s": batched, "batch": batch}


def _synthetic_texts(num_texts: int = 200, words: int = 30) -> list[str]:
    rng = np.random.default_rng(0)
    vocabulary = [f"word{i}" for i in range(2000)]
    return [" ".join(rng.choice(vocabulary, words)) for _ in range(num_texts)]


def _encoder_throughput(num_texts: int = 200, words: int = 30) -> dict:
    """Texts per second of the hashing and (when its package is installed) the JAX MiniLM encoder, warm; with torch
    and sentence-transformers installed, the reference MiniLM on the same texts beside them."""
    from rivet_jax.bench import torch_reference
    from rivet_jax.encoders import HashingEncoder, make_encoder

    texts = _synthetic_texts(num_texts, words)
    encoders = {"hashing": HashingEncoder(dim=1024)}
    try:
        encoders["minilm"] = make_encoder({"name": "minilm"})
    except (ImportError, FileNotFoundError, ValueError) as error:  # optional: the package may be absent
        encoders["minilm"] = str(error)
    result = {}
    for name, encoder in encoders.items():
        if isinstance(encoder, str):
            result[name] = {"skipped": encoder}
            continue
        encoder.encode(texts[:8])  # warm up (compiles the neural encoders' first shapes)
        encoder.encode(texts)
        started = time.perf_counter()
        encoder.encode(texts)
        result[name] = {"texts_per_s": num_texts / (time.perf_counter() - started), "words_per_text": words}
    result["minilm_sentence_transformers"] = torch_reference.reference_minilm_throughput(texts)
    return result


def _torch_reference(config, data, pool, steps: int, jax_rates: dict) -> dict:
    """The eager PyTorch port of the same update (rivet_jax/torch_reference.py) on the same data, when torch is
    installed: steps/s with torch's default threads and with one, and JAX's rates over them."""
    from rivet_jax.bench import torch_reference

    reason = torch_reference.missing_reason("torch")
    if reason is not None:
        return {"skipped": reason}
    default = torch_reference.benchmark_update(config, data, pool, steps=steps, stage="td")
    one_thread = torch_reference.benchmark_update(config, data, pool, steps=steps, stage="td", threads=1)
    return {"default_threads": default, "one_thread": one_thread,
            "jax_jit_per_step_over_torch": jax_rates["jit_per_step"] / default["steps_per_s"],
            "jax_scan_over_torch": jax_rates["scan"] / default["steps_per_s"]}


def _scaling(config, batch_sizes=(16, 32, 64, 128, 256), candidates=(6, 16, 32, 64),
             corpus_sizes=(1_000, 10_000, 100_000), disk_corpus_sizes=(1_000, 10_000, 100_000, 1_000_000),
             steps: int = 128, directory: str | Path | None = None) -> dict:
    """TD+CQL steps/s against batch size, number of candidates and corpus size, one factor at a time from the
    paper's sizes, every point `steps` warm updates in `lax.scan`: device-resident up to 10^5 transitions, and
    host-fed from a memory-mapped table written to `directory` (a temporary directory by default; deleted
    afterwards) up to 10^6."""
    def sized(batch: int) -> ml_collections.ConfigDict:
        copy = ml_collections.ConfigDict(config.to_dict())
        copy.optim.batch_size = batch
        return copy

    def rate(batch: int, models: int, transitions: int) -> float:
        cfg, pool = sized(batch), synthetic_pool(models)
        data = synthetic_data(transitions, cfg.encoder.dim, pool, seed=cfg.seed)
        tx = make_optimizer(Optim.of(cfg))
        return _time_scanned_steps(cfg, make_network(cfg), tx, data, "td", pool, steps)["steps_per_s"]

    def disk_rate(transitions: int, where: str) -> dict:
        pool = synthetic_pool(6)
        started = time.perf_counter()
        data = synthetic_data(transitions, config.encoder.dim, pool, seed=config.seed, directory=where)
        written = time.perf_counter() - started
        tx = make_optimizer(Optim.of(config))
        measured = _time_host_fed_steps(config, make_network(config), tx, data, "td", pool, steps)
        path = Path(data.embeddings.filename)
        point = {"x": transitions, "steps_per_s": measured["steps_per_s"], "table_gb": path.stat().st_size / 1e9,
                 "write_s": written}
        del data
        path.unlink()
        return point

    base_batch, base_models = config.optim.batch_size, 6
    result = {"batch_size": [{"x": b, "steps_per_s": rate(b, base_models, 10_000)} for b in batch_sizes],
              "candidates": [{"x": m, "steps_per_s": rate(base_batch, m, 10_000)} for m in candidates],
              "corpus_size": [{"x": n, "steps_per_s": rate(base_batch, base_models, n)} for n in corpus_sizes]}
    with tempfile.TemporaryDirectory(dir=directory) as where:
        result["corpus_size_memory_mapped"] = [disk_rate(n, where) for n in disk_corpus_sizes]
    return result


def plot_scaling(scaling: dict, path: str | Path) -> None:
    """One panel per factor; the corpus panel shows the device-resident and the memory-mapped curves together."""
    from matplotlib.figure import Figure

    panels = {"batch_size": {"": scaling["batch_size"]}, "candidates": {"": scaling["candidates"]},
              "corpus_size": {"device-resident": scaling["corpus_size"],
                              "memory-mapped, host-fed": scaling.get("corpus_size_memory_mapped", [])}}
    fig = Figure(figsize=(11, 3.4))
    for ax, (name, curves) in zip(fig.subplots(1, 3), panels.items()):
        xs = sorted({p["x"] for points in curves.values() for p in points})
        for label, points in curves.items():
            if points:
                ax.plot([p["x"] for p in points], [1e3 / p["steps_per_s"] for p in points], "o-", label=label or None)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(xs, [f"{x:g}" for x in xs])  # the measured points only: readable labels
        ax.set_xlabel(name.replace("_", " "))
        ax.set_ylabel("ms per TD+CQL update")
        if len(curves) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_benchmark(config: ml_collections.ConfigDict, num_transitions: int = PAPER_TRANSITIONS,
                  num_models: int = 6, single_steps: int = 200, scaling: bool = False,
                  encoders: bool = False, prefix_reuse: tuple[str, str] | None = None, runs: int = 27,
                  matmul_reference: float | None = None, main_job: str | None = None) -> dict:
    """Measures everything; returns a JSON-ready dict. `prefix_reuse`: (MINT logs, tiny Qwen3 fixture) dirs;
    `runs`: how many runs the vmapped run-group line trains together (27: the RouteSim reproduction's);
    `matmul_reference`: the machine's matmul FLOP/s if already measured (the launcher prints it first);
    `main_job`: a config (`main_job.MAIN_JOB`: the tiny reproduction) to run the main job with, in a child process,
    for its seconds and peak memory per phase."""
    pool = synthetic_pool(num_models)
    data = synthetic_data(num_transitions, config.encoder.dim, pool, seed=config.seed)
    net, tx = make_network(config), make_optimizer(Optim.of(config))
    result = {
        "device": str(jax.devices()[0]), "backend": jax.default_backend(), "jax": jax.__version__,
        "sizes": {"transitions": num_transitions, "state_dim": config.encoder.dim, "models": num_models,
                  "card_dim": config.model.card_dim, "hidden": config.model.hidden,
                  "batch": config.optim.batch_size},
        "single_step": {stage: _time_single_steps(config, net, tx, data, stage, pool, single_steps)
                        for stage in ("mc", "td")},
        "offline_training": _time_offline_training(config, net, tx, data, pool),
        "matmul_flops_per_s": matmul_reference or matmul_flops_per_s(),
        "routing": _routing_latency(config, net, tx, data, pool),
    }
    scan_rate = result["offline_training"]["td"]["scan_steps_per_s"] or result["single_step"]["td"]["steps_per_s"]
    analytic = update_matmul_flops(config, num_models, int(data.card_x.shape[1]), "td")
    xla = _update_flops(config, net, tx, data, "td", pool)
    result["td_update"] = {"flops": analytic, "flops_per_s": analytic * scan_rate,
                           "fraction_of_matmul": analytic * scan_rate / result["matmul_flops_per_s"],
                           "xla_flops": xla, "xla_fraction_of_matmul": xla * scan_rate / result["matmul_flops_per_s"]}
    result["run_group"] = run_group_throughput(config, net, tx, data, pool, runs,
                                                result["offline_training"]["td"]["scan_steps_per_s"])
    result["torch_reference"] = _torch_reference(config, data, pool, single_steps, {
        "jit_per_step": result["single_step"]["td"]["steps_per_s"], "scan": scan_rate})
    if encoders:
        result["encoders"] = _encoder_throughput()
    if prefix_reuse is not None:
        result["prefix_reuse"] = _prefix_reuse(*prefix_reuse)
    if scaling:
        result["scaling"] = _scaling(config)
    if main_job:
        with tempfile.TemporaryDirectory(prefix="rivet-bench-main-job-") as workdir:
            result["main_job"] = run_main_job(workdir, main_job)
    result["load_average_after"] = os.getloadavg()  # other work on the machine skews every rate above
    return result


def _prefix_reuse(mint_dir: str, fixture_dir: str) -> dict:
    """Qwen3 prefix reuse on the MINT logs (rivet_jax/bench/prefix_reuse_report.py), when both directories exist."""
    from rivet_jax.bench.prefix_reuse_report import prefix_reuse_report

    missing = [d for d in (mint_dir, fixture_dir) if not Path(d).is_dir()]
    if missing:
        return {"skipped": f"not found: {', '.join(missing)}"}
    return prefix_reuse_report(mint_dir, fixture_dir)


def format_table(result: dict) -> str:
    single, offline, group = result["single_step"], result["offline_training"], result["run_group"]
    rows = [("machine reference: 2048^2 matmul", f"{result['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s",
             "float32; read every time and rate below against it"),
            ("MC update, jit per step", f"{single['mc']['steps_per_s']:.0f} steps/s",
             f"compile {single['mc']['compile_s']:.2f}s"),
            ("TD+CQL update, jit per step", f"{single['td']['steps_per_s']:.0f} steps/s",
             f"compile {single['td']['compile_s']:.2f}s"),
            ("MC epoch in lax.scan", f"{offline['mc']['scan_steps_per_s'] or float('nan'):.0f} steps/s",
             f"first epoch (with compile) {offline['mc']['first_epoch_s']:.2f}s"),
            ("TD+CQL epoch in lax.scan", f"{offline['td']['scan_steps_per_s'] or float('nan'):.0f} steps/s",
             f"first epoch (with compile) {offline['td']['first_epoch_s']:.2f}s"),
            (f"offline training {offline['mc']['epochs']} MC + {offline['td']['epochs']} TD epochs",
             f"{offline['total_s']:.2f} s", "wall time, compile included, encoding excluded"),
            *run_group_rows(group),
            ("TD+CQL update, achieved", f"{result['td_update']['flops_per_s'] / 1e9:.1f} GFLOP/s",
             f"{result['td_update']['flops'] / 1e6:.0f} MFLOP of matmuls per update (analytic), "
             f"{100 * result['td_update']['fraction_of_matmul']:.0f}% of a 2048^2 matmul's "
             f"{result['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s (XLA's count, all ops: "
             f"{result['td_update']['xla_flops'] / 1e6:.0f} MFLOP, "
             f"{100 * result['td_update']['xla_fraction_of_matmul']:.0f}%)"),
            ("routing, one decision", f"{result['routing']['p50_us']:.0f} us p50",
             f"p99 {result['routing']['p99_us']:.0f} us; state embedding given, all candidates scored"),
            ("routing, batched", f"{result['routing']['batched_decisions_per_s']:.0f} decisions/s",
             f"batches of {result['routing']['batch']}")]
    rows += _torch_rows(result["torch_reference"])
    for name, row in result.get("encoders", {}).items():
        rows.append((f"encoder {name}", f"{row['texts_per_s']:.0f} texts/s" if "texts_per_s" in row else "skipped",
                     f"{row.get('words_per_text', '')} words per text" if "texts_per_s" in row else row["skipped"]))
    rows += _prefix_reuse_rows(result.get("prefix_reuse"))
    if "main_job" in result:
        rows += main_job_rows(result["main_job"])
    for name, points in result.get("scaling", {}).items():
        rows.append((f"scaling: {name.replace('_', ' ')}",
                     " ".join(f"{p['x']}:{p['steps_per_s']:.0f}" for p in points), "x: TD+CQL steps/s"))
    sizes = result["sizes"]
    header = (f"RIVET update benchmark on {result['device']} ({result['backend']}, jax {result['jax']}); "
              f"{sizes['transitions']} transitions, D={sizes['state_dim']}, M={sizes['models']}, "
              f"batch {sizes['batch']}")
    width = max(len(r[0]) for r in rows)
    return "\n".join([header] + [f"  {name:<{width}}  {value:>16}  {note}" for name, value, note in rows])


def _torch_rows(torch_result: dict) -> list[tuple[str, str, str]]:
    if "skipped" in torch_result:
        return [("TD+CQL update, PyTorch eager", "skipped", torch_result["skipped"])]
    default, one = torch_result["default_threads"], torch_result["one_thread"]
    return [("TD+CQL update, PyTorch eager", f"{default['steps_per_s']:.0f} steps/s",
             f"torch {default['torch']}, {default['threads']} threads ({one['steps_per_s']:.0f} steps/s on 1); "
             f"JAX is {torch_result['jax_jit_per_step_over_torch']:.2f}x (jit per step), "
             f"{torch_result['jax_scan_over_torch']:.2f}x (lax.scan epoch)")]


def _prefix_reuse_rows(report: dict | None) -> list[tuple[str, str, str]]:
    if report is None:
        return []
    if "skipped" in report:
        return [("Qwen3 prefix reuse on MINT", "skipped", report["skipped"])]
    rows = []
    for tokenizer, counts in report["corpus"].items():
        tails = next(v for k, v in counts.items() if k.startswith("tails_up_to"))
        rows.append((f"Qwen3-0.6B prefix reuse, {tokenizer}", f"{tails['flop_ratio']:.2f}x fewer FLOPs",
                     f"{counts['flops_separate'] / 1e15:.2f} -> {tails['flops'] / 1e15:.2f} PFLOP, "
                     f"{counts['tokens_separate']:,} -> {tails['tokens']:,} tokens over {counts['distinct_texts']:,} "
                     f"MINT states (strict prefixes only: {counts['strict_prefixes']['flop_ratio']:.2f}x)"))
    if "timing" in report:
        timing = report["timing"]
        rows.append(("prefix reuse, wall time (tiny model)", f"{timing['speedup_second_call']:.2f}x faster",
                     f"{timing['separate_second_call_s']:.2f}s -> {timing['prefix_reuse_second_call_s']:.2f}s on "
                     f"{timing['episodes']} episodes' states; max abs difference {timing['max_abs_difference']:.1e}"))
    return rows


def write_json(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
