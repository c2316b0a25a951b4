"""Issue 14, runs that mix and checkpoints: a resume after the config or the logs changed, two runs on one workdir,
damaged checkpoints and non-finite parameters are each refused (or worked around) out loud, never silently."""

import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rivet_jax import checkpointing, corpus, engine, run_identity, stage_run, train
from rivet_jax.data.schema import ModelCard, ModelPool
from rivet_jax.data.validation import DataError
from rivet_jax.runs import check_same_config
from rivet_jax.networks import rve_params
from rivet_jax.router import Router
from rivet_jax.workdir_lock import WorkdirBusyError, hold_workdir
from tests.common import REPO, run_stage, tiny_config


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny MC stage (epochs 1 and 2 kept); tests copy it before changing anything."""
    workdir = tmp_path_factory.mktemp("trained")
    run_stage(tiny_config(), workdir, "mc")
    return workdir


def copy_of(trained: Path, tmp_path: Path) -> Path:
    workdir = tmp_path / "run"
    shutil.copytree(trained, workdir)
    return workdir


# ------------------------------------------------------------------------------------ 1. runs that mix


def test_differences_name_every_changed_key():
    old = {"reward": {"lam": 0.05, "gamma": 0.99}, "seed": 1, "gone": 3}
    new = {"reward": {"lam": 0.1, "gamma": 0.99}, "seed": 2, "added": True}
    assert run_identity.differences(old, new) == ["added: <unset> -> True", "gone: 3 -> <unset>",
                                                  "reward.lam: 0.05 -> 0.1", "seed: 1 -> 2"]


def test_which_settings_are_the_run_identity():
    assert run_identity.is_identity("reward.lam", "mc", resuming=True)
    assert run_identity.is_identity("optim.lr", "td", resuming=False)
    assert run_identity.is_identity("mc_epochs", "td", resuming=False)      # an earlier stage's length
    assert not run_identity.is_identity("td_epochs", "td", resuming=True)   # the own stage may train longer
    assert not run_identity.is_identity("td_epochs", "mc", resuming=True)   # a later stage's
    assert not run_identity.is_identity("checkpoints_to_keep", "mc", resuming=True)
    assert not run_identity.is_identity("devices", "mc", resuming=True)
    assert not run_identity.is_identity("data.episodes", "mc", resuming=True)  # compared by content instead
    assert not run_identity.is_identity("evaluate.rollouts", "td", resuming=True)
    assert run_identity.is_identity("online.lr", "online", resuming=True)
    assert not run_identity.is_identity("online.lr", "online", resuming=False)  # starting online from TD


def test_resume_with_changed_config_is_refused_listing_every_difference(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    changed = tiny_config(**{"reward.lam": 0.1, "optim.lr": 1e-3, "reward.gamma": 0.9})
    with pytest.raises(checkpointing.ConfigChangedError) as refused:
        run_stage(changed, workdir, "mc")
    message = str(refused.value)
    assert "reward.lam: 0.05 -> 0.1" in message and "optim.lr: 0.0003 -> 0.001" in message
    assert "reward.gamma: 0.99 -> 0.9" in message and "\n" not in message
    # TD starts from the MC parameters: those must be this run's too, epochs included
    with pytest.raises(checkpointing.ConfigChangedError, match="mc_epochs: 2 -> 1"):
        run_stage(tiny_config(mc_epochs=1), workdir, "td")
    # fewer epochs than the stage already holds: the finished state would not be what the config asks
    with pytest.raises(checkpointing.ConfigChangedError, match=r"mc_epochs: 2 -> 1 \(the checkpoint already holds 2"):
        run_stage(tiny_config(mc_epochs=1), workdir, "mc")
    assert checkpointing.StageCheckpoints(workdir, "mc").latest_epoch() == 2  # nothing was written


def test_harmless_changes_and_more_epochs_resume(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    longer = tiny_config(mc_epochs=3, checkpoints_to_keep=3, checkpoint_every_epochs=2, devices=1,
                         **{"data.host_chunk_steps": 7, "online.lr": 1.0, "td_epochs": 9})
    run_stage(longer, workdir, "mc")
    assert checkpointing.StageCheckpoints(workdir, "mc").latest_epoch() == 3


def test_resume_on_changed_logs_is_refused_but_moved_logs_resume(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    logs = tmp_path / "moved"
    logs.mkdir()
    for name in ("episodes.jsonl", "model_cards.json"):
        shutil.copy(workdir / "data" / name, logs / name)
    moved = tiny_config(mc_epochs=3, **{"data.episodes": str(logs / "episodes.jsonl"),
                                        "data.cards": str(logs / "model_cards.json")})
    run_stage(moved, workdir, "mc")  # same bytes elsewhere: the same run
    lines = (logs / "episodes.jsonl").read_text().splitlines()
    (logs / "episodes.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(checkpointing.ConfigChangedError, match=r"corpus\.episodes \(sha256 of the file\)"):
        run_stage(moved, workdir, "mc")


def test_check_same_config_lists_the_differences(tmp_path):
    path = tmp_path / "corpus" / "config.json"
    check_same_config(path, {"sim": {"seed": 0}, "collect": {"tasks": 5}})
    check_same_config(path, {"sim": {"seed": 0}, "collect": {"tasks": 5}})
    with pytest.raises(checkpointing.ConfigChangedError, match=r"collect\.tasks: 5 -> 6; sim\.seed: 0 -> 1"):
        check_same_config(path, {"sim": {"seed": 1}, "collect": {"tasks": 6}})


# --------------------------------------------------------------------------------- 2. one run per workdir


def test_second_run_on_a_held_workdir_is_refused_with_the_holders_pid(tmp_path):
    with hold_workdir(tmp_path):
        with pytest.raises(WorkdirBusyError, match=f"in use by another training run \\(pid {os.getpid()} on "):
            train.train(tiny_config(), tmp_path)
        fd = os.open(tmp_path / ".lock", os.O_RDWR)  # another open file description conflicts, even in-process
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    assert not (tmp_path / "checkpoints").exists()  # refused before reading or writing anything
    with hold_workdir(tmp_path):  # released at the end of the block
        pass


def test_a_stale_lock_file_does_not_block(tmp_path):
    (tmp_path / ".lock").write_text("pid 999999 on a-host-that-died\n")
    with hold_workdir(tmp_path):
        assert (tmp_path / ".lock").read_text().startswith(f"pid {os.getpid()} ")


@pytest.mark.slow
def test_launcher_refuses_a_held_workdir_in_one_line(tmp_path):
    with hold_workdir(tmp_path):
        result = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/default.py:tiny",
                                 f"--workdir={tmp_path}", "--config.data.demo=True"], cwd=REPO, capture_output=True,
                                text=True, timeout=300)
    assert result.returncode == 1
    assert f"WorkdirBusyError: {tmp_path.resolve()} is in use by another training run (pid {os.getpid()}" \
        in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("code", ["EACCES", "EROFS", "ENOSPC"])
def test_a_workdir_that_cannot_be_written_is_one_line_not_a_traceback(code, caplog):
    """A read-only or full workdir (root, as in CI, cannot be denied a write: the OSError is raised by hand)."""
    import errno

    from launch.common import run_reporting_user_errors

    def job():
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), "/srv/W/checkpoints")

    with pytest.raises(SystemExit) as exit_:
        run_reporting_user_errors(job)
    assert exit_.value.code == 1
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage().endswith(f"{os.strerror(getattr(errno, code))}: /srv/W/checkpoints")
    assert not record.exc_info

    def bug():
        raise OSError(errno.EBADF, "Bad file descriptor")   # not the user's to fix: the traceback stays

    with pytest.raises(OSError):
        run_reporting_user_errors(bug)


def test_costs_that_overflow_the_mean_are_one_config_error_naming_the_way_out():
    from rivet_jax.config_checks import ConfigError
    from rivet_jax.data.replay import reference_cost
    from rivet_jax.data.schema import Episode, Task, Turn

    turn = Turn(model="m", response="r", feedback="", prompt_tokens=1, completion_tokens=1, cost=1e308)
    episodes = [Episode(f"e{i}", Task("t", "p"), (turn, turn), 1) for i in range(3)]
    with pytest.raises(ConfigError, match="reward.c_ref"):
        reference_cost(episodes)


# ------------------------------------------------------------------------------- 3. damaged checkpoints


def _first_data_file(step: Path) -> Path:
    return sorted(p for p in (step / "state").rglob("*") if p.is_file() and p.parent.name == "d")[0]


def _truncate(step: Path):
    data = _first_data_file(step)
    data.write_bytes(data.read_bytes()[: len(data.read_bytes()) // 2])


def _flip_a_byte(step: Path):
    data = _first_data_file(step)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))


def _garbage_meta(step: Path):
    (step / "meta" / "metadata").write_text("{not json")


def _garbage_state(step: Path):
    (step / "state" / "_METADATA").write_text("garbage")


def _no_state(step: Path):
    shutil.rmtree(step / "state")


def _no_meta(step: Path):
    shutil.rmtree(step / "meta")


DAMAGES = [_truncate, _flip_a_byte, _garbage_meta, _garbage_state, _no_state, _no_meta]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_router_falls_back_to_the_newest_intact_checkpoint(trained, tmp_path, damage, caplog):
    workdir = copy_of(trained, tmp_path)
    step = checkpointing.stage_dir(workdir, "mc") / "2"
    damage(step)
    with caplog.at_level(logging.WARNING):
        router = Router.from_checkpoint(workdir, stage="mc")
    assert f"checkpoint {step} is damaged" in caplog.text and "using epoch 1 instead" in caplog.text
    assert step.is_dir()  # a reader leaves the evidence where it is
    epoch_1, _ = checkpointing.StageCheckpoints(trained, "mc").restore(None, epoch=1)
    for got, want in zip(leaves(router._params), leaves(rve_params(epoch_1["params"]))):
        np.testing.assert_array_equal(got[0], want)


def test_training_resumes_from_the_newest_intact_checkpoint_to_the_same_parameters(trained, tmp_path, caplog):
    workdir = copy_of(trained, tmp_path)
    step = checkpointing.stage_dir(workdir, "mc") / "2"
    _truncate(step)
    with caplog.at_level(logging.WARNING):
        resumed = run_stage(tiny_config(), workdir, "mc")  # moves epoch 2 aside, trains it again
    assert f"moved to {step.with_name('2.damaged')}" in caplog.text
    assert step.with_name("2.damaged").is_dir() and checkpointing.damage(step) is None
    straight = run_stage(tiny_config(), trained, "mc")  # finished: restores only
    for got, want in zip(leaves(resumed.params), leaves(straight.params)):
        np.testing.assert_array_equal(got, want)


def valid_meta(**extra) -> dict:
    """The smallest meta `checkpointing.checked_meta` accepts (what a run's save writes, less the config)."""
    pool = ModelPool((ModelCard("a", "model a"),))
    return {"stage": "mc", "config": {}, "pool": pool.to_json(), "encoder": {"fingerprint": "hashing-8"},
            "c_ref": 1.0, "state_dim": 3, "corpus": {}, **extra}


@pytest.mark.parametrize("keep", [1, 2])
def test_a_kill_inside_a_save_leaves_a_checkpoint_to_resume_from_whatever_is_kept(tmp_path, monkeypatch, keep):
    """A kill after orbax's save and before the checksums land (issue 40): at checkpoints_to_keep = 1 orbax had
    already deleted the previous step inside its save, leaving one unverified step and nothing to resume from. The
    previous step must stay until the new one is verified; the resumed run saves that epoch again."""
    def state(k):
        return {"w": jnp.arange(3.0) + k}

    checkpoints = checkpointing.StageCheckpoints(tmp_path, "mc", max_to_keep=keep, repair=True)
    checkpoints.save(1, state(1), valid_meta(epoch_note=1))
    checkpoints.save(2, state(2), valid_meta(epoch_note=2))

    def killed(step):
        raise KeyboardInterrupt  # SIGINT / SIGTERM delivered between the save and its checksums
    monkeypatch.setattr(checkpointing, "write_checksums", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save(3, state(3), valid_meta(epoch_note=3))
    monkeypatch.undo()
    checkpoints.close()

    resumed = checkpointing.StageCheckpoints(tmp_path, "mc", max_to_keep=keep, repair=True)
    assert resumed.latest_epoch() == 2
    restored, meta = resumed.restore({"w": jnp.zeros(3)})
    np.testing.assert_array_equal(restored["w"], state(2)["w"])
    assert meta["epoch_note"] == 2
    resumed.save(3, state(3), valid_meta(epoch_note=3))
    assert resumed.epochs() == [2, 3][-keep:]


def test_a_full_disk_stops_a_save_with_one_clear_error_and_loses_no_checkpoint(tmp_path, monkeypatch):
    """A disk too full for the next save: refused before orbax writes (its threads' tracebacks were 669 lines on a
    2 MB tmpfs), or, where the room ran out during the write (tensorstore's RESOURCE_EXHAUSTED), turned into the
    same OSError(ENOSPC) the launchers report in one line (the test above); the last checkpoint stays intact."""
    import errno
    from collections import namedtuple

    checkpoints = checkpointing.StageCheckpoints(tmp_path, "mc", repair=True)
    checkpoints.save(1, {"w": jnp.arange(3.0)}, valid_meta())
    usage = namedtuple("usage", "total used free")
    big = {"w": jnp.zeros(1 << 16)}   # 256 kB of float32: 1.3 MB with the headroom
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9, 1_000_000))
    with pytest.raises(OSError) as refused:
        checkpoints.save(2, big, valid_meta())
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(checkpoints.directory)
    assert refused.value.strerror == ("no space left on the device to save mc epoch 2 (1.0 MB free, about 1.3 MB "
                                      "needed): make room and run the same command again; it resumes after epoch 1")
    assert sorted(p.name for p in checkpoints.directory.iterdir()) == ["1"]   # nothing of epoch 2 written

    def full(*args, **kwargs):
        raise ValueError('RESOURCE_EXHAUSTED: Error writing local file "W/2.orbax-checkpoint-tmp/_sharding": '
                         'Failed to write 6171 bytes to file 13: No space left on device [os_error_code=\'28\']')
    monkeypatch.setattr(checkpoints._manager, "save", full)
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9, 2_000_000))
    with pytest.raises(OSError) as ran_out:
        checkpoints.save(2, {"w": jnp.arange(3.0)}, valid_meta())   # room enough by the estimate; the write fails
    assert ran_out.value.errno == errno.ENOSPC
    assert ran_out.value.strerror == ("no space left on the device to save mc epoch 2 (2.0 MB free): make room and "
                                      "run the same command again; it resumes after epoch 1")
    monkeypatch.undo()
    assert checkpointing.StageCheckpoints(tmp_path, "mc").latest_epoch() == 1

    def bug(*args, **kwargs):
        raise ValueError("an orbax bug")   # anything else stays what it was
    monkeypatch.setattr(checkpoints._manager, "save", bug)
    with pytest.raises(ValueError, match="an orbax bug"):
        checkpoints.save(2, {"w": jnp.arange(3.0)}, valid_meta())


def test_old_steps_are_pruned_to_the_newest_kept_and_the_kept_period(tmp_path):
    checkpoints = checkpointing.StageCheckpoints(tmp_path, "td", max_to_keep=1, keep_period=2, repair=True)
    for epoch in range(1, 6):
        checkpoints.save(epoch, {"w": jnp.ones(2) * epoch}, {})
    assert checkpoints.epochs() == [2, 4, 5]
    everything = checkpointing.StageCheckpoints(tmp_path / "all", "td", max_to_keep=None)
    for epoch in range(1, 4):
        everything.save(epoch, {"w": jnp.ones(2) * epoch}, {})
    assert everything.epochs() == [1, 2, 3]


def test_no_intact_checkpoint_is_a_clear_error(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    for epoch in ("1", "2"):
        _garbage_meta(checkpointing.stage_dir(workdir, "mc") / epoch)
    with pytest.raises(checkpointing.DamagedCheckpointError,
                       match="no intact checkpoint in .*mc/2: meta/metadata does not match its checksum"):
        Router.from_checkpoint(workdir)
    with pytest.raises(checkpointing.DamagedCheckpointError, match="delete the directory"):
        train.train(tiny_config(stage="mc"), workdir)


# ------------------------------------------------------------------------------------ 4. NaN parameters


def test_router_refuses_non_finite_parameters(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    checkpoints = checkpointing.StageCheckpoints(workdir, "mc")
    state, meta = checkpoints.restore(None)
    broken = jax.tree.map(lambda x: jnp.asarray(x).at[(0,) * x.ndim].set(jnp.nan), state["params"])
    checkpoints.save(3, {**state, "params": broken}, meta)  # as a run without the finiteness check would have
    checkpoints.close()
    with pytest.raises(checkpointing.NonFiniteError, match=r"mc/3: the parameters \["):
        Router.from_checkpoint(workdir)


def test_a_step_symlinked_to_another_runs_checkpoint_is_not_loaded(trained, tmp_path, caplog):
    """checkpoints/mc/3 -> another run's step: it loaded that router without a word; now it is passed over as
    damaged, with a warning naming where it points, for the newest step of this run."""
    workdir, other = copy_of(trained, tmp_path / "W"), copy_of(trained, tmp_path / "other")
    os.symlink(checkpointing.stage_dir(other, "mc") / "2", checkpointing.stage_dir(workdir, "mc") / "3")
    with caplog.at_level(logging.WARNING):
        Router.from_checkpoint(workdir, stage="mc")
    assert "mc/3 is damaged (it resolves to" in caplog.text and "outside its stage directory" in caplog.text
    assert "using epoch 2 instead" in caplog.text


def test_parameters_of_other_shapes_than_the_meta_gives_are_one_mismatch_error(trained, tmp_path):
    """A checkpoint whose stored arrays disagree with the width its own config and meta give (a checkpoint saved
    again with another network, its checksums rewritten): the router names the step and the first differing
    parameters instead of orbax's trace."""
    workdir = copy_of(trained, tmp_path)
    checkpoints = checkpointing.StageCheckpoints(workdir, "mc")
    state, meta = checkpoints.restore(None)
    wider = jax.tree.map(lambda x: jnp.zeros((*x.shape[:-1], x.shape[-1] + 1), x.dtype) if x.ndim else x,
                         state["params"])
    checkpoints.save(3, {**state, "params": wider}, meta)
    checkpoints.close()
    with pytest.raises(checkpointing.CheckpointMismatchError,
                       match=r"mc/3: its parameters do not have the shapes its config and meta give \(\[.* stored, "
                             r".* expected"):
        Router.from_checkpoint(workdir)


def _set(meta: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for key in path:
        meta = meta[key]
    if value is _DELETE:
        del meta[last]
    else:
        meta[last] = value


_DELETE = object()


@pytest.mark.parametrize("field, value, message", [
    ("c_ref", float("nan"), "field 'c_ref': must be finite"),
    ("c_ref", "0.001", "field 'c_ref': expected number, got str"),
    ("c_ref", -1.0, "field 'c_ref': expected a cost scale > 0"),
    ("state_dim", 0, "field 'state_dim': must be >= 1"),
    ("state_dim", True, "field 'state_dim': expected int, got bool"),
    ("config.model.hidden", -3, "field 'config.model.hidden': expected an integer >= 1"),
    ("config.model.card_dim", "wide", "field 'config.model.card_dim': expected an integer >= 1"),
    ("config", None, "field 'config': expected a JSON object, got null"),
    ("encoder.fingerprint", _DELETE, "field 'encoder.fingerprint': missing required field"),
    ("stage", "best", "field 'stage': expected one of mc, td, online"),
    ("format_version", 99, "field 'format_version': 99 is newer than this rivet_jax reads"),
    ("corpus.episodes", 7, "field 'corpus.episodes': expected a digest string, got int"),
    ("pool", "a,b", "(pool): field '<record>': expected a JSON object, got str"),
])
def test_an_edited_meta_is_one_error_naming_the_file_and_field(trained, tmp_path, field, value, message):
    """A meta edited (or written by something else) with its checksums rewritten to match: the checksums cannot
    tell, the schema does, before a network is built from it or a value used (issue 40). Before: NaN c_ref loaded
    and made every score NaN, a string state_dim or a negative width crashed inside flax."""
    workdir = copy_of(trained, tmp_path)
    step = checkpointing.stage_dir(workdir, "mc") / "2"
    meta_file = step / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    _set(meta, field, value)
    meta_file.write_text(json.dumps(meta))
    checkpointing.write_checksums(step)
    with pytest.raises(DataError, match=re.escape(f"{meta_file}") + ".*" + re.escape(message)):
        Router.from_checkpoint(workdir, stage="mc")


def test_an_epoch_that_was_not_kept_or_is_damaged_is_a_clear_error(trained, tmp_path):
    """A deployment (or a caller) naming an epoch: one not on disk was orbax's AttributeError; a damaged one was
    loaded as it was."""
    workdir = copy_of(trained, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of epoch 999 in .*mc \(kept: 1, 2\)"):
        Router.from_checkpoint(workdir, stage="mc", epoch=999)
    _garbage_meta(checkpointing.stage_dir(workdir, "mc") / "1")
    with pytest.raises(checkpointing.DamagedCheckpointError, match=r"mc/1 is damaged: meta/metadata does not match"):
        Router.from_checkpoint(workdir, stage="mc", epoch=1)
    Router.from_checkpoint(workdir, stage="mc", epoch=2)


def test_a_stages_checkpoints_copied_under_another_stages_name_are_refused(trained, tmp_path):
    """checkpoints/mc copied to checkpoints/td (a mixed-up workdir): it was served as the TD router."""
    workdir = copy_of(trained, tmp_path)
    shutil.copytree(checkpointing.stage_dir(workdir, "mc"), checkpointing.stage_dir(workdir, "td"))
    with pytest.raises(DataError, match=r"td/2/meta/metadata: field 'stage': a mc checkpoint in the td stage's"):
        Router.from_checkpoint(workdir, stage="td")


def test_a_checksums_file_naming_a_path_outside_its_step_marks_it_damaged(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    step = checkpointing.stage_dir(workdir, "mc") / "2"
    sums = json.loads((step / checkpointing.CHECKSUMS).read_text())
    sums["meta/../../../../other/file"] = "0" * 64
    (step / checkpointing.CHECKSUMS).write_text(json.dumps(sums))
    assert checkpointing.damage(step) == f"its {checkpointing.CHECKSUMS} names 'meta/../../../../other/file', outside the step"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_training_never_saves_non_finite_parameters(tmp_path):
    # One step per epoch (the batch exceeds the corpus) and an infinite step size: the loss is finite, the
    # parameters after the update are not. Such a learning rate is refused up front (`check_config`), so the
    # stage is run through the engine directly.
    config = tiny_config(**{"optim.batch_size": 4096, "optim.lr": 1e39})
    run = stage_run.StageRun.open(config, tmp_path, "mc", corpus.prepare_data(config, tmp_path))
    with pytest.raises(checkpointing.NonFiniteError, match=r"stage mc: the parameters .* after epoch 1 "
                                                           r"\(step 1\); nothing of it was saved. "
                                                           r"Suspect the config: optim.lr=1e\+39"):
        engine.train_together([run])
    assert checkpointing.StageCheckpoints(tmp_path, "mc").latest_epoch() is None


def test_divergence_at_the_first_step_names_the_config(tmp_path):
    config = tiny_config()
    prepared = corpus.prepare_data(config, tmp_path)
    broken = corpus.PreparedData(**{**prepared.__dict__, "data": prepared.data.replace(
        replay={**prepared.data.replay, "mc_return": prepared.data.replay["mc_return"].at[:].set(jnp.inf)})})
    with pytest.raises(checkpointing.NonFiniteError, match=r"at the stage's first step: suspect the config "
                                                           r"\(optim.lr=0.0003, reward.lam=0.05"):
        run_stage(config, tmp_path, "mc", prepared=broken)


def test_meta_records_the_corpus_and_checksums(trained):
    step = checkpointing.stage_dir(trained, "mc") / "2"
    meta = json.loads((step / "meta" / "metadata").read_text())
    assert meta["format_version"] == 2 and set(meta["corpus"]) == {"episodes", "cards"}
    sums = json.loads((step / checkpointing.CHECKSUMS).read_text())
    assert set(sums) == set(checkpointing.item_files(step))


def test_a_setting_added_by_a_newer_version_does_not_block_a_resume(trained, tmp_path):
    workdir = copy_of(trained, tmp_path)
    meta = checkpointing.StageCheckpoints(workdir, "mc").restore_meta()
    newer = {**meta["config"], "loss": {**meta["config"]["loss"], "added_since": 1.0}}
    assert run_identity.resume_differences(meta, newer, meta["corpus"], "mc") == []
    changed = {**newer, "loss": {**newer["loss"], "beta": 0.5}}
    assert run_identity.resume_differences(meta, changed, meta["corpus"], "mc") == ["loss.beta: 1.0 -> 0.5"]


def test_launcher_logs_keep_orbax_warnings_but_not_its_item_metadata_noise(trained, caplog):
    """Restoring a router made orbax warn that each item of the composite checkpoint has no metadata of its own
    (1,578 lines in one live run): the launchers' filter drops exactly that warning, not a missing step metadata."""
    absl = logging.getLogger("absl")
    before = list(absl.filters)
    checkpointing.quiet_orbax_logs()
    try:
        with caplog.at_level(logging.INFO, logger="absl"):
            Router.from_checkpoint(trained, stage="mc")
        assert not [r for r in caplog.records if "Metadata file does not exist" in r.getMessage()]
        drop = absl.filters[-1]

        def orbax_record(level, msg, path):
            return logging.LogRecord("absl", level, "/x/orbax/checkpoint/_src/metadata/checkpoint.py", 1, msg,
                                     (path,), None)

        step = trained / "checkpoints" / "mc" / "2"
        assert drop.filter(orbax_record(logging.WARNING, "Metadata file does not exist: %s",
                                        step / "_CHECKPOINT_METADATA"))                    # a step's: still shown
        assert not drop.filter(orbax_record(logging.WARNING, "Metadata file does not exist: %s",
                                            step / "state" / "_CHECKPOINT_METADATA"))      # an item's: dropped
        assert not drop.filter(orbax_record(logging.INFO, "Saved %s", step))               # orbax's INFO: dropped
        assert drop.filter(orbax_record(logging.ERROR, "Failed to read Metadata file: %s", step))
    finally:
        absl.filters[:] = before
