"""Converters from other logging formats to the trajectory schema (`rivet_jax.data.schema`), one module per format.

- `openai` (`openai_chat.py`): OpenAI chat-completions logs, one conversation per JSONL line (`id`, `messages`
  with `model` and `usage` on each assistant message, `outcome`).
- `mtrouter` (`mtrouter.py`): MTRouter's `*.traj.json` trajectory files, one file or a directory tree of them.
- `mint` (`mint.py`, with `mint_tasks.py` and `mint_tokens.py`): MINT's logs, this project's `../shared/mint` copy,
  upstream mint-bench's `data/`, or the large pool's layout (`../shared/mint-large`: xz files, three categories).

Each module's docstring documents its input with a small example and the mapping to episodes. `convert` is the one
call `launch.convert` makes; `common.py` holds what the converters share.
"""

from __future__ import annotations

import os

from rivet_jax.data.converters.common import Conversion
from rivet_jax.data.converters.mint import convert_mint
from rivet_jax.data.converters.mtrouter import convert_mtrouter
from rivet_jax.data.converters.openai_chat import convert_openai_chat
from rivet_jax.data.model_pool import ModelPool

__all__ = ["FORMATS", "Conversion", "convert"]

FORMATS = ("openai", "mtrouter", "mint")


def convert(fmt: str, path: str | os.PathLike, pool: ModelPool, outcome_scale: tuple[float, float] | None = None,
            skip_invalid: bool = False, max_skipped_fraction: float = 0.1) -> Conversion:
    """The episodes of the logs at `path` in format `fmt` (one of FORMATS), every model a card of `pool`.

    `outcome_scale=(low, high)`: the range of the logged outcome, mapped linearly onto [0, 1] (openai: instead of
    [0, 1]; mtrouter: instead of the benchmark's). MINT logs a 0/1 success, so there it is an error.
    `skip_invalid` (openai): bad records are skipped and counted (a note each, up to five), up to
    `max_skipped_fraction` of the records.
    """
    if skip_invalid and fmt != "openai":
        raise ValueError(f"skipping bad records is for --format=openai (one conversation per line), not {fmt}")
    if fmt == "openai":
        skipped: list | None = [] if skip_invalid else None
        episodes = convert_openai_chat(path, pool, outcome_scale, skipped, max_skipped_fraction)
        notes = [f"skipped {len(skipped)} bad record(s)"] + [f"skipped: {error}" for error in skipped[:5]] \
            if skipped else []
        return Conversion(episodes=episodes, notes=notes)
    if fmt == "mtrouter":
        return convert_mtrouter(path, pool, outcome_scale)
    if fmt == "mint":
        if outcome_scale is not None:
            raise ValueError("MINT logs a 0/1 success: an outcome scale does not apply")
        corpus = convert_mint(path, pool)
        return Conversion(episodes=corpus.episodes, notes=corpus.notes)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
