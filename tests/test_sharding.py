"""Data parallelism and host-fed training.

- One run (launch.train) on 8 simulated CPU devices (device-resident and host-fed from a memory-mapped table) and
  on 1 reaches the same parameters, its batches split over all 8; a checkpoint saved on 8 devices restores (and
  routes) on 1.
- (The tiny reproduction's run groups and launch.calibrate's on 8 devices: tests/test_reproduce.py and
  tests/test_calibrate.py, beside the 1-device runs they compare with.)
- Two processes of two devices each (a real multi-host run over gloo) train on their own replay slices and end
  with the parameters of the same global batches computed here in one process.

They run in subprocesses so that the forced device counts never leak into the rest of the suite.
"""

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
from rivet_jax.settings import with_overrides
from rivet_jax.networks import make_network
from rivet_jax.settings import LossWeights, Optim, UpdateRule
from tests.common import RECORD_LAYOUTS, cpu_env, run_on_eight_devices

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys
    import jax
    import numpy as np
    from configs import default
    from rivet_jax import train
    from rivet_jax.settings import with_overrides
    from rivet_jax.router import Router
""") + RECORD_LAYOUTS + textwrap.dedent("""
    assert len(jax.devices()) == 8, jax.devices()
    workdir = sys.argv[1]
    runs = {"d8": {"devices": 8}, "disk8": {"devices": 8, "data.embeddings_on_disk": True}, "d1": {"devices": 1}}
    states = {}
    for name, overrides in runs.items():  # what launch.train runs: train.train, a group of one
        config = with_overrides(default.get_config("tiny"), {"stage": "offline", "data.demo": True, **overrides})
        states[name] = train.train(config, f"{workdir}/{name}")
    for name in ("d8", "disk8"):
        print(name, "max abs difference", worst(states[name].params, states["d1"].params))
        assert worst(states[name].params, states["d1"].params) < 1e-4, name
    # One run: its batch split over all 8 devices (device-resident and host-fed), parameters on all 8.
    assert [layout for layout in LAYOUTS if layout[1] == 8] == [(1, 8, (), 8)] * 4, LAYOUTS
    with jax.default_device(jax.devices()[0]):
        router = Router.from_checkpoint(f"{workdir}/d8")  # saved from 8 devices, restored as plain arrays
        decision = router.route("Task: add 2 and 3", [])
    assert decision.model in router.pool.names
    print("ok")
""")


@pytest.mark.slow
def test_one_run_on_eight_devices_matches_one_and_checkpoints_move_between_them(tmp_path):
    run_on_eight_devices(SCRIPT, tmp_path)


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
        cwd=REPO, env=cpu_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    logs = [host.communicate(timeout=300)[0] for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert all("process {} of 2: 2 local devices, 4 in all".format(i) in log for i, log in enumerate(logs))

    # The same run in this process: global batch = host 0's rows of its slice, then host 1's of its slice.
    config = with_overrides(default.get_config("tiny"), {
        "stage": "mc", "data.episodes": str(tmp_path / "episodes.jsonl"), "data.cards": str(tmp_path / "cards.json")})
    prepared = corpus.prepare_data(config, tmp_path / "here")
    net, tx = make_network(config), learner.make_optimizer(Optim.of(config))
    dim = prepared.data.embeddings.shape[1]
    state = learner.template_state(config.seed, net, tx, dim, prepared.pool, "mc")
    update = jax.jit(learner.make_update(net, tx, UpdateRule.of(config), "mc"))
    n, batch = prepared.data.num_transitions, config.optim.batch_size
    for epoch in range(config.mc_epochs):
        key = jax.random.fold_in(state.key, epoch)
        batches = np.concatenate([np.asarray(sharding.epoch_batches(key, n, batch, 2, p)) for p in (0, 1)], axis=1)
        for idx in batches:
            state, _ = update(state, corpus.gather_batch(prepared.data, idx), prepared.data.cards(),
                              LossWeights.of(config))
    like = learner.saveable(learner.template_state(config.seed, net, tx, dim, prepared.pool, "mc"))
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
