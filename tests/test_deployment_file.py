"""deploy.json read through one validated schema (rivet_jax/deployment_file.py): every malformed file a red team
tried (issue 40) is one DataError naming the file and the field, before anything is loaded; nothing loads a router
from outside the workdir; a well-formed file (a byte-order mark included) reads as written."""

import json
import os

import pytest

from rivet_jax.data.validation import DataError
from rivet_jax.deployment_file import DEPLOY_FILE, has_deployment, read_deployment_spec
from rivet_jax.serve.served import deployment_version

GOOD = {"name": "td k=0.5", "runs": ["."], "stage": "td", "epoch": None, "pessimism": 0.0, "commit": False,
        "recentring": {"k": 0.5, "floor": {"a": 0.1, "b": 0.2}, "centre": {"a": 0.0, "b": -0.1}}}


def write(workdir, content):
    path = workdir / DEPLOY_FILE
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode("utf-8"))
    return path


def with_field(**changes):
    return {"deploy": {**GOOD, **changes}}


def test_a_well_formed_deployment_reads_as_written_with_or_without_a_byte_order_mark(tmp_path):
    write(tmp_path, {"deploy": GOOD, "estimator": "DR"})
    assert read_deployment_spec(tmp_path) == GOOD
    write(tmp_path, b"\xef\xbb\xbf" + json.dumps({"deploy": GOOD}).encode("utf-8"))
    assert read_deployment_spec(tmp_path) == GOOD
    write(tmp_path, with_field(runs=["candidates/a", "candidates/a/seeds/1042"], epoch=5, commit=True,
                               recentring=None))
    assert read_deployment_spec(tmp_path)["epoch"] == 5
    grouped = {**GOOD["recentring"], "groups": {"math": {"floor": {"a": 0.3, "b": 0.1}, "centre": {"a": 0.0, "b": 0.0}},
                                                "": {"floor": {"a": 0.0, "b": 0.1}, "centre": {"a": 0.2, "b": 0.0}}}}
    write(tmp_path, with_field(recentring=grouped))
    assert read_deployment_spec(tmp_path)["recentring"] == grouped


@pytest.mark.parametrize("content, field, why", [
    (b"", "<file>", "empty"),
    (b"   \n", "<file>", "empty"),
    (b"null", "deploy", "expected an object"),
    (b"[]", "deploy", "expected an object"),
    (b'{"deploy": null}', "deploy", "got null"),
    (b"\xff\xfe{}", "<file>", "not UTF-8 \\(byte 0\\)"),
    (json.dumps({"deploy": GOOD}).encode()[:-7], "<file>", "not JSON"),               # truncated
    (with_field(runs=[]), "deploy.runs", "non-empty list"),
    (with_field(runs="."), "deploy.runs", "non-empty list"),
    (with_field(runs=[3]), "deploy.runs", "non-empty list"),
    (with_field(runs=["../other"]), "deploy.runs", "outside the workdir"),
    (with_field(runs=["/tmp"]), "deploy.runs", "outside the workdir"),
    (with_field(stage=None), "deploy.stage", "expected one of mc, td, online, got None"),
    (with_field(stage="offline"), "deploy.stage", "expected one of"),
    (with_field(epoch=-1), "deploy.epoch", "integer >= 0"),
    (with_field(epoch=2.5), "deploy.epoch", "integer >= 0"),
    (with_field(epoch=True), "deploy.epoch", "integer >= 0"),
    (with_field(pessimism=-1), "deploy.pessimism", "finite number >= 0"),
    (with_field(pessimism="0"), "deploy.pessimism", "finite number >= 0"),
    (with_field(commit="false"), "deploy.commit", "true or false, got 'false'"),
    (with_field(commit=0), "deploy.commit", "true or false"),
    (with_field(recentring=[]), "deploy.recentring", "null or an object"),
    (with_field(recentring={**GOOD["recentring"], "k": None}), "deploy.recentring.k", "finite number"),
    (with_field(recentring={**GOOD["recentring"], "floor": {"a": float("nan"), "b": 0.0}}),
     "deploy.recentring.floor", "finite number per model"),
    (with_field(recentring={**GOOD["recentring"], "centre": {"a": float("inf"), "b": 0.0}}),
     "deploy.recentring.centre", "finite number per model"),
    (with_field(recentring={**GOOD["recentring"], "floor": {}}), "deploy.recentring.floor", "an object"),
    (with_field(recentring={**GOOD["recentring"], "groups": []}), "deploy.recentring.groups", "an object"),
    (with_field(recentring={**GOOD["recentring"], "groups": {"math": None}}), "deploy.recentring.groups.math",
     "floor and centre"),
    (with_field(recentring={**GOOD["recentring"], "groups": {"math": {"floor": {"a": 0.1, "b": 0.2}}}}),
     "deploy.recentring.groups.math.centre", "an object"),
    (with_field(recentring={**GOOD["recentring"], "groups": {"math": {
        "floor": {"a": 0.1, "b": "high"}, "centre": {"a": 0.0, "b": 0.0}}}}),
     "deploy.recentring.groups.math.floor", "finite number per model"),
])
def test_every_malformed_deployment_is_one_error_naming_the_file_and_field(tmp_path, content, field, why):
    write(tmp_path, content)
    with pytest.raises(DataError, match=why) as caught:
        read_deployment_spec(tmp_path)
    assert caught.value.field == field and caught.value.path == str(tmp_path / DEPLOY_FILE)
    assert "\n" not in str(caught.value)


def test_a_directory_or_a_dangling_symlink_is_named_not_skipped_for_the_last_stage(tmp_path):
    """A deploy.json that is a directory or a symlink to nothing still names a deployment (`has_deployment`), so
    Router.from_checkpoint refuses it rather than silently serving the last trained stage."""
    (tmp_path / DEPLOY_FILE).mkdir()
    assert has_deployment(tmp_path)
    with pytest.raises(DataError, match="a directory"):
        read_deployment_spec(tmp_path)
    assert deployment_version(tmp_path).startswith("deploy:unreadable")       # the proxy's watcher does not crash
    (tmp_path / DEPLOY_FILE).rmdir()
    os.symlink(tmp_path / "gone.json", tmp_path / DEPLOY_FILE)
    assert has_deployment(tmp_path)
    with pytest.raises(DataError, match="which does not exist"):
        read_deployment_spec(tmp_path)


def test_a_run_symlinked_outside_the_workdir_is_refused(tmp_path):
    workdir, elsewhere = tmp_path / "W", tmp_path / "other_router"
    workdir.mkdir(), elsewhere.mkdir()
    os.symlink(elsewhere, workdir / "candidates")
    write(workdir, with_field(runs=["candidates"]))
    with pytest.raises(DataError, match="outside the workdir"):
        read_deployment_spec(workdir)
