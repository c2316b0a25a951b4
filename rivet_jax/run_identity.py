"""What makes a training run the same run: the settings and the corpus its checkpoints were made with.

A resume continues the run whose checkpoints are in the workdir, so everything that shaped those parameters must
be what this run would use; otherwise the result would silently mix two runs. Which settings count, for a run
resuming (or starting) stage S, is declared per key in `settings.SETTINGS` (`settings.resume_kind`):

    identity    RUN keys (seed, max_state_tokens, target_sync_steps; data, reward, model, loss, optim);
                TD keys (loss.alpha, loss.cql_on) from the TD stage on: not for an MC stage, which never reads
                them (so a grid's runs of one seed may share it), nor for TD starting from an MC checkpoint;
                EPOCHS keys of the stages before S (their finished parameters are S's start);
                for the online stage resuming itself: ONLINE keys (online and sim: its schedule and environment)
    by content  the logs (data.episodes, data.cards): their sha256, not their paths, so moved logs still resume;
                the encoder: its fingerprint (checkpointing.check_compatible), not its batch size or weights path
    free        S's own epoch count (raise it to train longer; lower it, but not below the epochs already done),
                the later stages' settings, devices, checkpoint cadence and retention, caches, host feeding,
                and the experiments' evaluation, selection and report sections

A key only one side has is not compared: an override cannot add a key, so it comes from another version of the
code (a setting added since, with a default), not from the user.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from rivet_jax.settings import EPOCHS, ONLINE, RUN, TD, resume_kind

STAGES = ("mc", "td", "online")  # training order
EPOCH_KEYS = {"mc": "mc_epochs", "td": "td_epochs"}
UNSET = "<unset>"


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differences(old: dict, new: dict, keys=None) -> list[str]:
    """'key: old -> new' for every dotted key (of `keys`, default all) whose value differs between two nested
    dicts of JSON values, sorted by key; a key one side lacks shows as <unset> there."""
    old, new = flatten(old), flatten(new)
    keys = sorted(set(old) | set(new)) if keys is None else sorted(keys)
    return [f"{key}: {_shown(old, key)} -> {_shown(new, key)}" for key in keys
            if old.get(key, UNSET) != new.get(key, UNSET)]


def _shown(values: dict, key: str) -> str:
    return repr(values[key]) if key in values else UNSET


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (read in blocks: a corpus need not fit in memory twice)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def corpus_digest(episodes: Sequence[str | os.PathLike], cards: str | os.PathLike) -> dict[str, str]:
    """What a checkpoint records of the logs it was trained on (several episode files: the digest of their
    digests in order; one: its own, as before)."""
    digests = [file_digest(path) for path in episodes]
    joined = digests[0] if len(digests) == 1 else hashlib.sha256(",".join(digests).encode()).hexdigest()
    return {"episodes": joined, "cards": file_digest(cards)}


def is_identity(key: str, stage: str, resuming: bool) -> bool:
    """Whether `key` must be unchanged for stage `stage` to continue from a checkpoint (of `stage` itself when
    `resuming`, else of an earlier stage whose parameters it starts from)."""
    kind = resume_kind(key)
    earlier = STAGES[:STAGES.index(stage)]
    made_by_td = stage == "online" or (stage == "td" and resuming)   # the checkpoint compared is TD's or later
    return (kind == RUN or (kind == TD and made_by_td)
            or (kind == EPOCHS and key in {EPOCH_KEYS.get(s) for s in earlier})
            or (kind == ONLINE and resuming and stage == "online"))


def resume_differences(meta: dict, config: dict, digest: dict[str, str] | None, stage: str) -> list[str]:
    """Everything that stops stage `stage` of a run (`config` as JSON, its corpus `digest`) from continuing from a
    checkpoint with `meta` (its config, corpus digest, stage and epoch), one 'what: old -> new' line each."""
    resuming = meta["stage"] == stage
    saved, current = flatten(meta["config"]), flatten(config)
    keys = [k for k in set(saved) & set(current) if is_identity(k, stage, resuming)]
    problems = differences(meta["config"], config, keys)
    own = EPOCH_KEYS.get(stage)
    if resuming and own is not None and current.get(own, 0) < meta["epoch"]:
        problems.append(f"{own}: {saved.get(own)!r} -> {current.get(own)!r} (the checkpoint already holds "
                        f"{meta['epoch']} epochs)")
    if "corpus" in meta and digest is not None:  # checkpoints of format 1 did not record their corpus
        problems += [f"corpus.{name} (sha256 of the file): {meta['corpus'].get(name, UNSET)[:12]}... -> "
                     f"{digest[name][:12]}..." for name in sorted(digest) if meta["corpus"].get(name) != digest[name]]
    return problems
