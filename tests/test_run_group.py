"""Many runs as one program (train.train_group over engine.py and online.py): each run ends where its solo run (a
group of one) ends, through the offline stages (one epoch program per stage) and the online stage (lockstep
rollouts and vmapped updates)."""

import json

import jax
import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax import checkpointing, corpus, engine, learner, online, runs, stage_run, train
from rivet_jax.settings import with_overrides
from rivet_jax.networks import make_network
from rivet_jax.settings import LossWeights, Optim


# Every kind of value a group varies: the seed, both loss weights, the response ablation, lambda and whether the
# run draws a learning curve.
VARIANTS = [{"seed": 0}, {"seed": 1, "loss.alpha": 0.0, "reward.lam": 0.5, "online.curve_points": ()},
            {"seed": 2, "loss.beta": 0.5, "loss.zero_response": True}]


def saved_params(config, workdir, stage):
    """Every parameter (RVE and RIVE) of `stage`'s last checkpoint in `workdir`."""
    prepared = corpus.prepare_data(config, workdir)
    like = learner.template_state(config.seed, make_network(config), learner.make_optimizer(Optim.of(config)),
                                  int(prepared.data.embeddings.shape[1]), prepared.pool, stage).params
    params, _ = checkpointing.StageCheckpoints(workdir, stage).restore_params(like)
    return params


def records(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def group_and_solo(tmp_path_factory):
    root = tmp_path_factory.mktemp("group")
    base = routesim_config.get_config("tiny")
    base = runs.training_config(base, runs.collected_corpus(base, root))
    configs = [with_overrides(base, {"stage": "all", "data.embedding_cache": str(root / "embeddings"), **v})
               for v in VARIANTS]
    compiled = []
    original = engine.make_group_epoch

    def counting(net, tx, config, stage, mesh=None):
        compiled.append(stage)
        return original(net, tx, config, stage, mesh)

    engine.make_group_epoch = counting
    try:
        train.train_group(configs, [root / "group" / str(i) for i in range(len(configs))])
    finally:
        engine.make_group_epoch = original
    for i, config in enumerate(configs):
        train.train(config, root / "solo" / str(i))
    return root, configs, compiled


@pytest.mark.slow
def test_all_runs_step_as_one_program_per_offline_stage(group_and_solo):
    _, _, compiled = group_and_solo
    assert compiled == ["mc", "td"]


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(VARIANTS)))
def test_group_run_equals_its_solo_run(group_and_solo, i):
    root, configs, _ = group_and_solo
    for stage in ("mc", "td", "online"):
        together = saved_params(configs[i], root / "group" / str(i), stage)
        alone = saved_params(configs[i], root / "solo" / str(i), stage)
        for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(together),
                                     jax.tree_util.tree_leaves_with_path(alone)):
            # On a CPU every run of the group steps its own one-run program, the runs side by side in threads
            # (`engine.in_threads`): exactly the arithmetic of the run alone. Vmapped (an accelerator) and solo
            # programs round differently, and each stage's updates carry that further: TD's bootstrapped targets
            # move one weight of 512 by 1.8e-6 on some CPUs, the online stage's many updates more (as 8 devices
            # against 1 do: tests/test_sharding.py); where the online stage went and what it kept are compared
            # exactly below.
            where = f"run {i} stage {stage} {jax.tree_util.keystr(path)}"
            if engine.runs_in_turn(configs[i]):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)
            else:
                atol = {"mc": 1e-6, "td": 1e-5, "online": 1e-4}[stage]
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=atol, err_msg=where)
    got, want = records(root / "group" / str(i)), records(root / "solo" / str(i))
    assert [(r["stage"], r["epoch"], r["step"]) for r in got] == [(r["stage"], r["epoch"], r["step"]) for r in want]
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want],
                               rtol=0 if engine.runs_in_turn(configs[i]) else 1e-4)
    # The online stage took the same trajectories, validated at the same points and kept the same checkpoint.
    got, want = (online.read_progress(root / kind / str(i)) for kind in ("group", "solo"))
    assert (got["trajectories"], got["best_at"], len(got["curve"])) == (want["trajectories"], want["best_at"],
                                                                        len(want["curve"]))
    np.testing.assert_allclose([v["val_return"] for v in got["validations"]],
                               [v["val_return"] for v in want["validations"]], rtol=1e-6)
    np.testing.assert_allclose([p["accuracy"] for p in got["curve"]], [p["accuracy"] for p in want["curve"]])
    # A run without curve points skips the test rollouts; the others draw one point per curve point they reached.
    reached = [p for p in configs[i].online.curve_points if p <= got["trajectories"]]
    assert [p["trajectories"] for p in got["curve"]] == reached


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["mc", "td"])
def test_vmapped_runs_equal_runs_one_after_another(stage):
    """`runs_vmapped` only changes how the program is laid out (GPU/TPU: all runs in every step), not the result."""
    from configs import default
    from rivet_jax.bench.benchmark import synthetic_data, synthetic_pool

    config = default.get_config("tiny")
    pool = synthetic_pool(3)
    data = synthetic_data(100, config.encoder.dim, pool)
    net, tx = make_network(config), learner.make_optimizer(Optim.of(config))
    ended = {}
    for vmapped in (0, 1):
        configs = [with_overrides(config, {"seed": s, "runs_vmapped": vmapped, "loss.alpha": a, "reward.lam": lam})
                   for s, a, lam in ((0, 0.1, 0.05), (1, 0.0, 0.05), (2, 0.1, 0.5))]
        states = learner.stack([learner.template_state(c.seed, net, tx, config.encoder.dim, pool, stage)
                                for c in configs])
        replays = [{**data.replay, "reward": data.replay["reward"] * (1 + i)} for i in range(len(configs))]
        values = learner.run_values([LossWeights.of(c) for c in configs], replays)
        epoch = engine.make_group_epoch(net, tx, configs[0], stage)
        for e in range(2):
            states, metrics, _ = epoch(states, data, values, jax.numpy.int32(e))
        ended[vmapped] = jax.tree.leaves(states.params)
        assert metrics["loss"].shape == (3, 100 // config.optim.batch_size)  # (R, S)
    for a, b in zip(*ended.values()):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stage", ["mc", "td"])
def test_runs_in_turn_end_where_each_run_alone_ends_bit_for_bit(stage):
    """On a CPU a group's runs step in turn through one program for a run, whatever the group's size: each ends
    exactly where it ends alone, and where the one group program mapping over the runs (the layout before) ends it
    (bit for bit at XLA's default flags; the suite's COMPILE_FAST rounds the two layouts differently)."""
    from configs import default
    from rivet_jax.bench.benchmark import synthetic_data, synthetic_pool

    config = default.get_config("tiny")
    pool = synthetic_pool(3)
    data = synthetic_data(100, config.encoder.dim, pool)
    net, tx = make_network(config), learner.make_optimizer(Optim.of(config))
    configs = [with_overrides(config, {"seed": s, "loss.alpha": a, "reward.lam": lam})
               for s, a, lam in ((0, 0.1, 0.05), (1, 0.0, 0.05), (2, 0.1, 0.5))]
    replays = [{**data.replay, "reward": data.replay["reward"] * (1 + i)} for i in range(3)]
    assert engine.runs_in_turn(configs[0])
    run_epoch = engine.make_run_epoch(net, tx, configs[0], stage)
    mapped = jax.jit(lambda states, d, v, e: engine.over_runs(configs[0], None, lambda s, o: run_epoch(s, o, d, e),
                                                              (states, v)), donate_argnums=0)

    def train(group_epoch, runs):
        states = learner.stack([learner.template_state(configs[r].seed, net, tx, config.encoder.dim, pool, stage)
                                for r in runs])
        values = learner.run_values([LossWeights.of(configs[r]) for r in runs], [replays[r] for r in runs])
        for e in range(2):
            states, metrics, batches = group_epoch(states, data, values, jax.numpy.int32(e))
        ended = []
        for i in range(len(runs)):
            run = learner.unstack(states, i)
            ended.append([*jax.tree.leaves((run.params, run.target_params, run.opt_state, run.step)),
                          jax.random.key_data(run.key), batches[i], metrics["loss"][i]])
        return ended

    together = train(engine.make_group_epoch(net, tx, configs[0], stage), [0, 1, 2])
    alone = [train(engine.make_group_epoch(net, tx, configs[0], stage), [r])[0] for r in range(3)]
    before = train(mapped, [0, 1, 2])
    for r in range(3):
        for a, b, c in zip(together[r], alone[r], before[r]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(c, np.float64), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_conservatism_grid_trains_its_mc_warm_start_once_per_seed(tmp_path):
    """Runs that differ only in the TD settings (loss.alpha, loss.cql_on) share one MC stage, trained in the first of
    them and copied to the others; each then trains its own TD stage from it, as its solo run does, and resumes."""
    base = routesim_config.get_config("tiny")
    base = runs.training_config(base, runs.collected_corpus(base, tmp_path))
    grid = [{"seed": 0}, {"seed": 0, "loss.alpha": 0.0}, {"seed": 1}, {"seed": 0, "loss.cql_on": "stochastic"}]
    configs = [with_overrides(base, {"stage": "offline", "data.embedding_cache": str(tmp_path / "embeddings"), **v})
               for v in grid]
    workdirs = [tmp_path / "grid" / str(i) for i in range(len(configs))]
    trained = []
    original = engine.train_together

    def counting(group, on_epoch_end=None, ahead=None):
        trained.append([run.stage for run in group])
        return original(group, on_epoch_end, ahead)

    engine.train_together = counting
    try:
        train.train_group(configs, workdirs)
    finally:
        engine.train_together = original
    assert sorted(map(len, trained)) == [2, 4]            # MC for seeds 0 and 1; TD for all four
    assert [r["stage"] for r in records(workdirs[1])].count("mc") == configs[1].mc_epochs
    assert all(r.get("taken_from") == str(workdirs[0]) for r in records(workdirs[1]) if r["stage"] == "mc")
    assert not any("taken_from" in r for r in records(workdirs[2]))
    for i in (1, 3):                                       # the same MC parameters, bit for bit
        for a, b in zip(jax.tree.leaves(saved_params(configs[0], workdirs[0], "mc")),
                        jax.tree.leaves(saved_params(configs[i], workdirs[i], "mc"))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The TD stage of a run that took its MC ends where the run alone ends (vmapped rounding: test_group_run_...)
    train.train(configs[1], tmp_path / "solo")
    for a, b in zip(jax.tree.leaves(saved_params(configs[1], workdirs[1], "td")),
                    jax.tree.leaves(saved_params(configs[1], tmp_path / "solo", "td"))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    assert not np.allclose(*(np.asarray(jax.tree.leaves(saved_params(configs[i], workdirs[i], "td"))[0])
                             for i in (0, 1)))          # alpha still matters in TD
    # A second call resumes: nothing is trained again, nothing copied twice.
    before = [len(records(w)) for w in workdirs]
    train.train_group(configs, workdirs)
    assert [len(records(w)) for w in workdirs] == before
    # A TD checkpoint is still the run's own: resuming it with another alpha is refused.
    with pytest.raises(checkpointing.ConfigChangedError, match="loss.alpha"):
        train.train_group([with_overrides(configs[1], {"loss.alpha": 0.5})], [workdirs[1]])


def test_the_lambdas_of_a_group_share_one_embedding_table(tmp_path):
    """Runs at other lambdas read the same texts: their corpora hold the first one's table and texts, not copies,
    and only the rewards and returns differ, equal to each lambda's own corpus read alone."""
    base = routesim_config.get_config("tiny")
    base = runs.training_config(base, runs.collected_corpus(base, tmp_path))
    configs = [with_overrides(base, {"reward.lam": lam, "data.embedding_cache": str(tmp_path / "embeddings")})
               for lam in (0.1, 0.5, 0.1)]
    workdirs = [tmp_path / str(i) for i in range(len(configs))]
    first, other, again = train.prepare_all(configs, workdirs)
    assert again is first
    assert other.data.embeddings is first.data.embeddings and other.replay.texts is first.replay.texts
    assert not np.allclose(other.replay.reward, first.replay.reward)
    alone = corpus.prepare_data(configs[1], tmp_path / "alone", c_ref=first.c_ref)
    np.testing.assert_array_equal(np.asarray(other.data.embeddings), np.asarray(alone.data.embeddings))
    for name, column in alone.replay.arrays().items():
        np.testing.assert_array_equal(other.replay.arrays()[name], column, err_msg=name)


def test_a_stage_compiled_ahead_from_the_corpus_shapes_serves_its_run_bit_for_bit(monkeypatch, tmp_path):
    """`engine.ProgramsAhead`: the MC program, compiled from the data's shapes as `prepare_data` tells them before
    embedding, is the program the run steps through (its jit holds that one compile after training), and the run
    ends bit for bit where a run that compiles its own program ends."""
    base = routesim_config.get_config("tiny")
    config = with_overrides(runs.training_config(base, runs.collected_corpus(base, tmp_path)),
                            {"stage": "mc", "data.embedding_cache": str(tmp_path / "embeddings")})
    told = []
    with engine.ProgramsAhead() as ahead:
        def on_shapes(shapes, pool):
            told.append(shapes)
            ahead.compile(config, "mc", shapes, pool)

        prepared = corpus.prepare_data(config, tmp_path / "ahead", on_shapes=on_shapes)
        assert told == [engine.shapes(prepared.data)]
        run = stage_run.StageRun.open(config, tmp_path / "ahead", "mc", prepared)
        assert ahead.program(config, "mc") is not None   # compiled (waits for it)
        compiled = []

        def listener(event, seconds, **fields):
            compiled.append(fields.get("fun_name"))

        jax.monitoring.register_event_duration_secs_listener(listener)
        try:
            engine.train_together([run], ahead=ahead)
        finally:
            jax.monitoring.unregister_event_duration_listener(listener)
        run.close()
        assert "run_epoch" not in compiled and "unstack" not in compiled, compiled
    monkeypatch.setattr(engine, "compiles_ahead", lambda config: False)
    train.train(config, tmp_path / "alone")
    for a, b in zip(jax.tree.leaves(saved_params(config, tmp_path / "ahead", "mc")),
                    jax.tree.leaves(saved_params(config, tmp_path / "alone", "mc"))):
        np.testing.assert_array_equal(a, b)


def test_a_host_fed_group_steps_its_runs_side_by_side_as_its_group_program_does(monkeypatch, tmp_path):
    """Host-fed (a table on disk), a CPU's group goes through a one-run chunk program per run, the runs side by side
    (`engine.in_threads`): every run ends where the group program mapping over them ends it (bit for bit at XLA's
    default flags; the suite's COMPILE_FAST rounds the two programs differently, by ~6e-9 here)."""
    from configs import default

    configs = [with_overrides(default.get_config("tiny"), {
        "stage": "mc", "data.demo": True, "data.embeddings_on_disk": True, "data.host_chunk_steps": 2,
        "seed": s, "loss.beta": b}) for s, b in ((0, 1.0), (1, 0.5), (2, 1.0))]
    ended = {}
    for side_by_side in (True, False):
        monkeypatch.setattr(engine, "side_by_side", lambda mesh, allowed=side_by_side: allowed)
        final = train.train_group(configs, [tmp_path / str(side_by_side) / str(i) for i in range(len(configs))])
        ended[side_by_side] = [np.asarray(leaf) for state in final for leaf in jax.tree.leaves(state.params)]
        metrics = [records(tmp_path / str(side_by_side) / str(i)) for i in range(len(configs))]
        ended[side_by_side] += [np.array([r["loss"] for r in m]) for m in metrics]
    for a, b in zip(ended[True], ended[False]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
