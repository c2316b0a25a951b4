"""Validate a JSONL episode file against a model-card file and print a summary.

    python -m launch.validate_data --episodes=PATH --cards=PATH [--skip_invalid] [--max_skipped_fraction=0.1]

Exits 0 when the files parse (with --skip_invalid, bad lines are listed but do not
fail the run unless more than --max_skipped_fraction of the records are bad) and 1 on
a DataError, printing it without a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import app, flags

from rivet_jax.data import schema
from rivet_jax.data.files import episode_paths

_EPISODES = flags.DEFINE_string("episodes", None, "JSONL episode file(s) to validate: a path, several separated by "
                                                  "commas, or a glob.")
_CARDS = flags.DEFINE_string("cards", None, "Model-card JSON file defining the pool.")
_SKIP_INVALID = flags.DEFINE_bool(
    "skip_invalid", False, "List bad lines and keep going instead of stopping at the first."
)
_MAX_SKIPPED = flags.DEFINE_float(
    "max_skipped_fraction", 0.1, "With --skip_invalid: fail when more than this fraction of records is bad "
    "(training's config.data.max_skipped_fraction)."
)
flags.mark_flags_as_required(["episodes", "cards"])


def format_summary(summary: dict) -> str:
    """The summary dict from schema.summarize_episodes as aligned text."""

    def fmt(value, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    lines = [
        f"episodes:       {summary['episodes']}",
        f"turns:          {summary['turns']}",
        f"mean outcome:   {fmt(summary['mean_outcome'], '.3f')}",  # the success rate of 0/1 outcomes
        f"mean turns:     {fmt(summary['mean_turns'], '.2f')}",
        f"total cost:     ${summary['total_cost']:.6f}",
        "turns per model:",
    ]
    width = max((len(name) for name in summary["turns_per_model"]), default=0)
    lines += [f"  {name:<{width}}  {count}" for name, count in summary["turns_per_model"].items()]
    lines.append(f"skipped lines:  {summary['skipped']}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        pool = schema.read_model_cards(_CARDS.value)
        ep_file = schema.read_episodes(episode_paths(_EPISODES.value), pool, skip_invalid=_SKIP_INVALID.value,
                                       max_skipped_fraction=_MAX_SKIPPED.value)
    except schema.DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(format_summary(schema.summarize_episodes(ep_file, pool)))
    for err in ep_file.skipped:
        print(f"  skipped {err}")
    return 0


if __name__ == "__main__":
    app.run(main)
