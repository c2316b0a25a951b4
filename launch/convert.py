"""Convert logs of another format into the trajectory schema's JSONL and print a summary.

    python -m launch.convert --format=openai|mtrouter|mint --input=PATH --cards=CARDS.json --output=OUT.jsonl
        [--outcome_scale=LOW,HIGH]

The formats and their inputs are documented in `rivet_jax/data/converters/`. The output is written atomically (a
half-written file is never left behind). Exits 1 on malformed input, printing the DataError (file:line: field: why)
as one line.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from absl import app, flags

from rivet_jax.data import converters, schema

_FORMAT = flags.DEFINE_enum("format", None, converters.FORMATS, "The input's format.")
_INPUT = flags.DEFINE_string("input", None, "The logs: a JSONL file (openai), a .traj.json file or a directory of "
                                            "them (mtrouter), a MINT data directory in any of its three layouts (mint).")
_CARDS = flags.DEFINE_string("cards", None, "Model-card JSON file defining the pool; every logged model must be in it.")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the episodes (JSONL).")
_OUTCOME_SCALE = flags.DEFINE_string(
    "outcome_scale", None, "LOW,HIGH: the range of the logged outcome, mapped linearly onto [0, 1] (default: openai "
    "[0, 1], mtrouter the benchmark's score range; not for mint).")
_SKIP_INVALID = flags.DEFINE_bool("skip_invalid", False, "openai: skip and count bad records instead of stopping at the "
                                                        "first (a note names the first five).")
_MAX_SKIPPED = flags.DEFINE_float("max_skipped_fraction", 0.1, "With --skip_invalid: refuse the file when more of its "
                                                               "records than this are bad.")
flags.mark_flags_as_required(["format", "input", "cards", "output"])


def parse_scale(text: str | None) -> tuple[float, float] | None:
    """--outcome_scale's (low, high), or None when not given."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        low, high = (float(part) for part in parts)
    except ValueError:
        raise app.UsageError(f"--outcome_scale expects LOW,HIGH (two numbers), got {text!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise app.UsageError(f"--outcome_scale needs finite LOW < HIGH, got {text!r}")
    return low, high


def format_summary(conversion: converters.Conversion, output: str) -> str:
    episodes = conversion.episodes
    costs = [turn.cost for episode in episodes for turn in episode.turns]
    lines = [
        f"wrote {len(episodes)} episodes ({len(costs)} turns) to {output}",
        f"mean outcome: {math.fsum(episode.outcome for episode in episodes) / len(episodes):.3f}",
        f"total cost:   ${math.fsum(costs):.6f}",
    ]
    return "\n".join(lines + [f"note: {note}" for note in conversion.notes])


def main(argv: Sequence[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    scale = parse_scale(_OUTCOME_SCALE.value)
    if scale is not None and _FORMAT.value == "mint":
        raise app.UsageError("--outcome_scale does not apply to --format=mint: MINT logs a 0/1 success")
    try:
        pool = schema.read_model_cards(_CARDS.value)
        if _SKIP_INVALID.value and _FORMAT.value != "openai":
            raise app.UsageError("--skip_invalid is for --format=openai")
        conversion = converters.convert(_FORMAT.value, _INPUT.value, pool, scale, _SKIP_INVALID.value,
                                        _MAX_SKIPPED.value)
        schema.write_episodes(_OUTPUT.value, conversion.episodes)
    except (schema.DataError, ImportError, OSError) as err:  # bad logs, MINT's tokenizer missing, an unwritable output
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(format_summary(conversion, _OUTPUT.value))
    return 0


if __name__ == "__main__":
    app.run(main)
