"""Data parallelism and host-fed training.

- The same tiny training on 8 simulated CPU devices (device-resident and host-fed from a memory-mapped table) and
  on 1 reaches the same parameters, and a checkpoint saved on 8 devices restores (and routes) on 1.
- Every stage, online adaptation included, runs on 8 devices; an online update there equals the 1-device one.
- Two processes of two devices each (a real multi-host run over gloo) train on their own replay slices and end
  with the parameters of the same global batches computed here in one process.

They run in subprocesses so that the forced device counts never leak into the rest of the suite.
"""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import default
from rivet_jax import checkpointing, corpus, learner, sharding
from rivet_jax.data.schema import write_episodes, write_model_cards
from rivet_jax.encoders import EmbeddingStore, HashingEncoder
from rivet_jax.encoders.table import host_table
from rivet_jax.envs.collect import demo_corpus
from rivet_jax.experiments.common import with_overrides
from rivet_jax.networks import make_network

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    from configs import default
    from rivet_jax import train
    from rivet_jax.experiments.common import with_overrides
    from rivet_jax.router import Router

    assert len(jax.devices()) == 8, jax.devices()
    workdir = sys.argv[1]
    runs = {"d8": {"devices": 8}, "disk8": {"devices": 8, "data.embeddings_on_disk": True}, "d1": {"devices": 1}}
    states = {}
    for name, overrides in runs.items():
        config = with_overrides(default.get_config("tiny"), {"stage": "offline", "data.demo": True, **overrides})
        states[name] = train.train(config, f"{workdir}/{name}")
    for name in ("d8", "disk8"):
        leaves = [jax.tree.leaves(states[n].params) for n in (name, "d1")]
        worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(*leaves))
        print(name, "max abs difference", worst)
        assert worst < 1e-4, (name, worst)
        sharded = jax.tree.leaves(states[name].params)[0].sharding
        assert len(sharded.device_set) == 8, sharded  # the 8-device run really used 8 devices
    with jax.default_device(jax.devices()[0]):
        router = Router.from_checkpoint(f"{workdir}/d8")  # saved from 8 devices, restored as plain arrays
        decision = router.route("Task: add 2 and 3", [])
    assert decision.model in router.pool.names
    print("ok")
""")


ONLINE_SCRIPT = textwrap.dedent("""
    import sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    from configs import routesim
    from rivet_jax import corpus, learner, online, sharding, train
    from rivet_jax.experiments import routesim as experiment
    from rivet_jax.experiments.common import with_overrides
    from rivet_jax.networks import make_network

    workdir = sys.argv[1]
    config = routesim.get_config("tiny")
    config = experiment.training_config(config, experiment.collect(config, workdir))
    config = with_overrides(config, {"devices": 8, "stage": "all"})
    train.train(config, f"{workdir}/d8")  # every stage, the online one included, on 8 devices
    assert online.read_progress(f"{workdir}/d8")["finished"]

    # One online update on 8 devices equals the same update on 1 (same logged and new replays, same key).
    prepared = corpus.prepare_data(config, f"{workdir}/d8")
    net, tx = make_network(config), learner.make_optimizer(config)
    replay = online.empty_replay(64, prepared.data.embeddings.shape[1], len(prepared.pool))
    rows = corpus.gather_batch(prepared.data, jnp.arange(40) % prepared.data.num_transitions)
    new = jax.tree.map(lambda r, v: jnp.concatenate([r, v[40:]]), rows, replay)  # 40 new transitions
    params = {}
    for devices in (8, 1):
        mesh = sharding.make_mesh(devices)
        start = learner.template_state(config, net, tx, prepared.data.embeddings.shape[1], prepared.pool, "td")
        states, buffers = learner.stack([start]), learner.stack([new])  # a run group of one
        data, values = prepared.data, learner.run_values([config], [prepared.data.replay])
        if devices > 1:
            states, data, buffers, values = (sharding.replicate(x, mesh) for x in (states, data, buffers, values))
        update = online.make_group_update(net, tx, config, mesh)
        for _ in range(3):
            states, _ = update(states, data, values, buffers, jnp.array([40], jnp.int32), jnp.array([True]))
        params[devices] = jax.tree.leaves(states.params)
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(params[8], params[1]))
    print("online max abs difference", worst)
    assert worst < 1e-5, worst
    print("ok")
""")


def _cpu_env(devices: int) -> dict:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(REPO)}


def _run_on_eight_devices(script: str, workdir) -> None:
    result = subprocess.run([sys.executable, "-c", script, str(workdir)], cwd=REPO, env=_cpu_env(8),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ok" in result.stdout


@pytest.mark.slow
def test_eight_devices_match_one_and_checkpoints_move_between_them(tmp_path):
    _run_on_eight_devices(SCRIPT, tmp_path)


@pytest.mark.slow
def test_online_stage_runs_data_parallel_and_its_update_matches_one_device(tmp_path):
    _run_on_eight_devices(ONLINE_SCRIPT, tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_hosts_train_on_their_slices_like_one_process_on_the_global_batches(tmp_path):
    sim, episodes = demo_corpus(9)
    write_model_cards(tmp_path / "cards.json", sim.pool)
    write_episodes(tmp_path / "episodes.jsonl", episodes)
    data_flags = [f"--config.data.episodes={tmp_path / 'episodes.jsonl'}",
                  f"--config.data.cards={tmp_path / 'cards.json'}"]
    port = _free_port()
    hosts = [subprocess.Popen(
        [sys.executable, "-m", "launch.train", "--multihost", f"--coordinator_address=localhost:{port}",
         "--num_processes=2", f"--process_id={i}", "--config=configs/default.py:tiny", f"--workdir={tmp_path / 'run'}",
         "--config.devices=0", "--config.stage=mc", *data_flags],
        cwd=REPO, env=_cpu_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    logs = [host.communicate(timeout=300)[0] for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert all("process {} of 2: 2 local devices, 4 in all".format(i) in log for i, log in enumerate(logs))

    # The same run in this process: global batch = host 0's rows of its slice, then host 1's of its slice.
    config = with_overrides(default.get_config("tiny"), {
        "stage": "mc", "data.episodes": str(tmp_path / "episodes.jsonl"), "data.cards": str(tmp_path / "cards.json")})
    prepared = corpus.prepare_data(config, tmp_path / "here")
    net, tx = make_network(config), learner.make_optimizer(config)
    dim = prepared.data.embeddings.shape[1]
    state = learner.template_state(config, net, tx, dim, prepared.pool, "mc")
    update = jax.jit(learner.make_update(net, tx, config, "mc"))
    n, batch = prepared.data.num_transitions, config.optim.batch_size
    for epoch in range(config.mc_epochs):
        key = jax.random.fold_in(state.key, epoch)
        batches = np.concatenate([np.asarray(sharding.epoch_batches(key, n, batch, 2, p)) for p in (0, 1)], axis=1)
        for idx in batches:
            state, _ = update(state, corpus.gather_batch(prepared.data, idx), prepared.data.cards())
    like = learner.saveable(learner.template_state(config, net, tx, dim, prepared.pool, "mc"))
    saved, meta = checkpointing.StageCheckpoints(tmp_path / "run", "mc").restore(like)
    assert meta["epoch"] == config.mc_epochs
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree.leaves(saved["params"]), jax.tree.leaves(state.params)))
    assert worst < 1e-5, worst


def test_epoch_batches_split_the_replay_into_disjoint_slices():
    key = jax.random.key(3)
    one = np.asarray(sharding.epoch_batches(key, 103, 16))
    assert one.shape == (6, 16) and len(set(one.ravel())) == 96  # 103 // 16 full batches, no repeats
    parts = [np.asarray(sharding.epoch_batches(key, 103, 16, 4, p)) for p in range(4)]
    for p, part in enumerate(parts):
        rows = sharding.replay_slice(103, 4, p)
        assert part.shape == (6, 4)  # every slice gives the same number of batches: 25 // 4
        assert rows.start <= part.min() and part.max() < rows.stop and len(set(part.ravel())) == part.size
    assert sharding.replay_slice(103, 4, 3) == slice(77, 103)


def test_host_table_embeds_only_its_rows_and_reuses_the_file(tmp_path):
    texts = [f"text number {i}" for i in range(10)]
    rows = np.array([1, 4, 7])
    encoder = HashingEncoder(dim=32)
    store = EmbeddingStore(encoder)
    table = host_table(encoder, lambda: store, texts, rows, tmp_path)
    assert isinstance(table, np.memmap) and table.shape == (10, 32)
    np.testing.assert_array_equal(table[rows], encoder.encode([texts[r] for r in rows]))
    assert not np.any(table[[0, 2, 3, 5, 6, 8, 9]])
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npy"  # the temporary file was renamed, nothing else left
    again = EmbeddingStore(encoder)
    np.testing.assert_array_equal(host_table(encoder, lambda: again, texts, rows, tmp_path), table)
    assert again.stats["encoded"] == 0  # the finished table was mapped, nothing re-encoded
    in_memory = host_table(encoder, lambda: EmbeddingStore(encoder), texts, rows, None)
    assert not isinstance(in_memory, np.memmap)
    np.testing.assert_array_equal(in_memory, table)
