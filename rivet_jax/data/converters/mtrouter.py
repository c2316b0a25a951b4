"""MTRouter's trajectory files (`*.traj.json`) -> episodes: a directory of them becomes one episode file.

MTRouter (Python package `miniagenticrouter`) writes one JSON document per agent run on a task. The fields read here,
and where MTRouter writes them, as read at
https://github.com/ZhangYiqun018/MTRouter/tree/255267285c3331a5d4f64af200355eb2761d8041/src/miniagenticrouter
(the file paths below are under it):

- `trajectory_format` "mini-agentic-router-1", `info`, `messages`: `run/utils/save.py: save_traj`.
- `messages`: the agent's history (`agents/default.py: DefaultAgent.run`): a system message, a user message with
  the task (its instance template), then each model call's assistant message followed by the user message with
  the environment's observation. An assistant message is the model's response dict: `content`; `model_name`, the
  model that answered (`routers/base.py: BaseRouter.query`; a single-model run has none, and its model is
  `info.config.model.model_name`); `propensity`, the probability the logging router drew that model with
  (`research/collection/propensity_router.py`, `routers/heuristic.py`); `fallback_from` when a context-window
  overflow sent the call to a fallback model; `extra.response.usage` (`prompt_tokens`, `completion_tokens`, and
  `cost` from OpenRouter: `models/litellm_model.py`, `models/openrouter_model.py`). Other keys are ignored.
- `info.exit_status`: runs ending "Submitted", "ForcedAnswer" or "LimitsExceeded" are complete (MTRouter's
  `research/collection/collector.py: COMPLETED_EXIT_STATUSES`); any other run (an API error) is left out, named in
  the notes, as MTRouter's collector reruns it.
- Score: `info.final_score`, ScienceWorld's score (`run/extra/scienceworld.py`), else HLE's judged
  `info.benchmark_data.judge_result.correct` as 1 or 0 (`research/collection/hle_collector.py`). Its range follows
  `info.benchmark` as in MTRouter's own reader (`research/trajectory/parser.py: BENCHMARK_CONFIGS`): ScienceWorld
  (the default) -100..100, "hle" 0..1, mapped linearly onto the outcome in [0, 1]: ScienceWorld's 50 is 0.75.
  `outcome_scale=(low, high)` replaces the range.
- Task: ScienceWorld's `info.task_name` and `info.variation_idx` (id `<task_name>_var<variation_idx>`, family the
  task name; `info.task_id` there carries the collector's `_run<k>` suffix), else `info.task_id` (HLE).

Mapping, as the OpenAI converter's: the first user message is the task prompt (the system message is the agent's
fixed instructions and is left out); each assistant message is a turn of its model, response its content, feedback
the user messages up to the next assistant message (joined by newlines; MTRouter writes one); propensity as logged,
dropped after a fallback (it is the drawn model's, not the one that answered); cost `usage.cost`, else the card's
prices x the tokens (the prompt cache's counts read as `common.tokens_and_cost` says). The episode id is the
file's path under the input directory without `.traj.json`.

Example (`roulette/boil_var0_run0/boil_var0_run0.traj.json`, abridged to the fields read):

```json
{"trajectory_format": "mini-agentic-router-1",
 "info": {"exit_status": "Submitted", "final_score": 50, "task_name": "boil", "variation_idx": 0},
 "messages": [{"role": "system", "content": "You are an agent."},
              {"role": "user", "content": "Boil water."},
              {"role": "assistant", "content": "look around", "model_name": "small", "propensity": 0.5,
               "extra": {"response": {"usage": {"prompt_tokens": 200, "completion_tokens": 30}}}},
              {"role": "user", "content": "Observation: a stove."}]}
```

is episode `roulette/boil_var0_run0/boil_var0_run0` on task `boil_var0` (family `boil`, prompt "Boil water."), one
turn of `small` ("look around", feedback "Observation: a stove.", propensity 0.5, cost from the card), outcome 0.75.
Errors are `DataError(file, None, field, why)`, the field being the JSON path (`messages[2].extra.response.usage`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rivet_jax.data.converters.common import Conversion, pool_model, tokens_and_cost
from rivet_jax.data.files import read_json_document
from rivet_jax.data.model_pool import ModelPool
from rivet_jax.data.outcomes import scale_outcome
from rivet_jax.data.schema import Episode, Task, Turn
from rivet_jax.data.validation import (
    MISSING, DataError, Where, as_int, as_number, as_str, optional, require_field, require_object, wrong_type,
)

__all__ = ["TRAJECTORY_FORMAT", "COMPLETED_EXIT_STATUSES", "SCORE_RANGES", "convert_mtrouter"]

TRAJECTORY_FORMAT = "mini-agentic-router-1"
COMPLETED_EXIT_STATUSES = ("Submitted", "ForcedAnswer", "LimitsExceeded")
SCORE_RANGES = {"scienceworld": (-100.0, 100.0), "hle": (0.0, 1.0)}  # info.benchmark -> the score's range
_SUFFIX = ".traj.json"


def convert_mtrouter(path: str | os.PathLike, pool: ModelPool,
                     outcome_scale: tuple[float, float] | None = None) -> Conversion:
    """Every complete trajectory in the file or directory tree at `path`, in path order; notes name those left out."""
    root = Path(path)
    if root.is_dir():
        base, files = root, sorted(root.rglob("*" + _SUFFIX))
    elif root.is_file():
        base, files = root.parent, [root]
    else:
        raise DataError(str(root), None, "<file>", "no such file or directory")
    if not files:
        raise DataError(str(root), None, "<file>", f"no *{_SUFFIX} files under this directory")
    episodes, notes = [], []
    for file in files:
        where = Where(str(file), None)
        document, incomplete = _document(read_json_document(file), where)
        if incomplete:
            notes.append(f"{file}: left out: {incomplete}")
            continue
        episode_id = file.relative_to(base).as_posix().removesuffix(_SUFFIX)
        episodes.append(_episode(document, episode_id, pool, outcome_scale, where))
    if not episodes:
        raise DataError(str(root), None, "<file>", f"no episodes: all {len(files)} trajectories were left out; "
                                                   f"the first: {notes[0]}")
    return Conversion(episodes=episodes, notes=notes)


def _document(document: Any, where: Where) -> tuple[Mapping[str, Any], str | None]:
    """The document, checked to be MTRouter's, and why it is left out (None: it is converted)."""
    document = require_object(document, where, "<document>")
    found = require_field(document, "trajectory_format", where, "")
    if found != TRAJECTORY_FORMAT:
        raise where.error("trajectory_format", f"expected '{TRAJECTORY_FORMAT}', got {found!r}")
    info = require_object(require_field(document, "info", where, ""), where, "info")
    messages = require_field(document, "messages", where, "")
    if not isinstance(messages, list):
        raise wrong_type(where, "messages", "list", messages)
    status = info.get("exit_status")
    if status not in COMPLETED_EXIT_STATUSES:
        return document, f"info.exit_status {status!r}: the run did not complete"
    if not any(isinstance(m, Mapping) and m.get("role") == "assistant" for m in messages):
        return document, "no assistant message: no model was called"
    return document, None


def _episode(document: Mapping[str, Any], episode_id: str, pool: ModelPool,
             outcome_scale: tuple[float, float] | None, where: Where) -> Episode:
    info = document["info"]
    prompt, steps = _steps(document["messages"], where)
    turns = tuple(_turn(message, index, feedback, info, pool, where) for index, message, feedback in steps)
    task_id, family = _task_id(info, where)
    score, field = _score(info, where)
    low, high = outcome_scale if outcome_scale is not None else _score_range(info, where)
    return Episode(episode_id=episode_id, task=Task(task_id, prompt, family), turns=turns,
                   outcome=scale_outcome(score, low, high, where, field))


def _steps(messages: list, where: Where) -> tuple[str, list[tuple[int, Mapping[str, Any], str]]]:
    """(task prompt, (index, assistant message, feedback) per model call)."""
    task: str | None = None
    steps: list[tuple[int, Mapping[str, Any], list[str]]] = []
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        message = require_object(message, where, field)
        role = as_str(require_field(message, "role", where, field + "."), where, field + ".role")
        content = as_str(require_field(message, "content", where, field + "."), where, field + ".content")
        if role == "assistant":
            if task is None:
                raise where.error(field + ".role", "an assistant message before any user message: there is no task")
            steps.append((i, message, []))
        elif role == "user":
            if steps:
                steps[-1][2].append(content)
            elif task is None:
                task = content
            else:
                raise where.error(field, "a second user message before the first assistant message: the task "
                                         "must be one message")
        elif role != "system" or task is not None:
            raise where.error(field + ".role", f"expected 'user' or 'assistant' here, got {role!r} (MTRouter writes "
                                               "one system message, first)")
    return task, [(i, message, "\n".join(feedback)) for i, message, feedback in steps]


def _turn(message: Mapping[str, Any], index: int, feedback: str, info: Mapping[str, Any], pool: ModelPool,
          where: Where) -> Turn:
    field = f"messages[{index}]"
    name, name_field = _model_name(message, info, where, field)
    card = pool_model(name, pool, where, name_field)
    extra = require_object(require_field(message, "extra", where, field + "."), where, field + ".extra")
    response = require_object(require_field(extra, "response", where, field + ".extra."), where,
                              field + ".extra.response")
    usage = require_field(response, "usage", where, field + ".extra.response.")
    call = tokens_and_cost(usage, card, where, field + ".extra.response.usage")
    propensity = None
    if "fallback_from" not in message:
        propensity = optional(message.get("propensity", MISSING), as_number, where, field + ".propensity")
    if propensity is not None and not 0.0 < propensity <= 1.0:
        raise where.error(field + ".propensity", f"must be in (0, 1], got {propensity}")
    return Turn(model=card.name, response=message["content"], feedback=feedback, propensity=propensity,
                **call.turn_fields())


def _model_name(message: Mapping[str, Any], info: Mapping[str, Any], where: Where, field: str) -> tuple[Any, str]:
    """(the name of the model that answered, the field it was read from)."""
    if "model_name" in message:
        return message["model_name"], field + ".model_name"
    config = _at(info, "config", "model")
    if isinstance(config, Mapping) and "model_name" in config:
        return config["model_name"], "info.config.model.model_name"
    raise where.error(field + ".model_name", "missing, and so is info.config.model.model_name (a single-model "
                                             "run's model)")


def _task_id(info: Mapping[str, Any], where: Where) -> tuple[str, str | None]:
    """(task id, family)."""
    if "task_name" in info:
        name = as_str(info["task_name"], where, "info.task_name", non_empty=True)
        variation = as_int(require_field(info, "variation_idx", where, "info."), where, "info.variation_idx")
        return f"{name}_var{variation}", name
    return as_str(require_field(info, "task_id", where, "info."), where, "info.task_id", non_empty=True), None


def _score(info: Mapping[str, Any], where: Where) -> tuple[Any, str]:
    """(the run's score, the field it was read from)."""
    if "final_score" in info:
        return info["final_score"], "info.final_score"
    correct = _at(info, "benchmark_data", "judge_result", "correct")
    if isinstance(correct, bool):
        return int(correct), "info.benchmark_data.judge_result.correct"
    raise where.error("info.final_score", "missing, and no judged info.benchmark_data.judge_result.correct either")


def _score_range(info: Mapping[str, Any], where: Where) -> tuple[float, float]:
    benchmark = info.get("benchmark", "scienceworld")
    if not isinstance(benchmark, str) or benchmark not in SCORE_RANGES:
        raise where.error("info.benchmark", f"no known score range for {benchmark!r} (known: "
                                            f"{', '.join(SCORE_RANGES)}); give outcome_scale=(low, high)")
    return SCORE_RANGES[benchmark]


def _at(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]..., or MISSING where a level is absent or not an object."""
    for key in keys:
        if not isinstance(obj, Mapping) or key not in obj:
            return MISSING
        obj = obj[key]
    return obj
