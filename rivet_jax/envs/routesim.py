"""RouteSim: multi-turn routing with a known optimum (Sec. 3; Assumptions A.2).

A task is a text prompt plus a hidden sequence of steps, each needing a skill at a difficulty and having a hidden
answer (an integer). Before every turn a policy picks one of six models; the model acts on the current step:

  outcome       probability                             response text                      environment's answer
  progress      p_s (1 - over_explain)                   `print(<right value>)` / solution   value / "correct"
  over_explain  p_s over_explain                         the same, padded with explanations  the same
  malformed     (1 - p_s) w_malformed                    broken code or an undefined name    SyntaxError / NameError
  drift         (1 - p_s) w_drift                        a search for something else         "Page ... not found"
  stall         (1 - p_s) w_stall                        long thought, no action             invalid action
  constraint    (1 - p_s) w_constraint                   a wrong value / a wrong solution    the value / "wrong"

with p_s = sigmoid(sharpness (competence[skill] - difficulty)). On the last step the action is a `<solution>`; two
wrong solutions or ten turns end the episode unsolved. The environment's answer, progress, termination and grading
are computed from the response text alone (`respond`), never from which model wrote it (identity-blind, A.2 (i)).
Cost is input price x prompt tokens + output price x completion tokens (A.2 (ii)); the prompt grows with every
completion and feedback, as a serialized history does. With a prompt cache (`sim.prompt_cache`, the variant
configs/routesim.py:cache), the part of the prompt that the same model was sent on the previous turn (that turn's
whole prompt) is billed at the model's cached-input price and the rest at its cache-write price (the input price
where it has none); a turn after a switch, and the first, pay the whole prompt so.

Because the hidden state of an episode is small, (step k, wrong proposals p, turn t, context tokens c), the optimal
routing for any lambda is computed exactly by dynamic programming over it (`oracle`; with a prompt cache also over
who served the previous turn and how much the prompt grew since), and so are the exact
accuracy and cost of any policy that reads only that state (fixed models, the random router, the oracle).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any, Sequence

import ml_collections
import numpy as np

from rivet_jax.data.schema import ModelCard, ModelPool, Task, Turn

OUTCOMES = ("progress", "over_explain", "malformed", "drift", "stall", "constraint")
FAILURES = OUTCOMES[2:]
SKILLS = ("plan", "retrieve", "compute", "code", "recall", "format")
SPLITS = ("train", "validation", "test")


# ------------------------------------------------------------------------------------------ configuration


def _parse_pairs(text: str) -> dict[str, float]:
    """'a=1,b=2.5' -> {'a': 1.0, 'b': 2.5}."""
    pairs = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        pairs[key.strip()] = float(value)
    return pairs


@dataclasses.dataclass(frozen=True)
class StepSpec:
    skill: str
    low: float
    high: float


def _parse_steps(text: str) -> tuple[StepSpec, ...]:
    """'plan:0.2-0.4,compute:0.3-0.6' -> step specs."""
    specs = []
    for item in text.split(","):
        skill, _, span = item.strip().partition(":")
        low, _, high = span.partition("-")
        if skill not in SKILLS:
            raise ValueError(f"unknown skill {skill!r} in steps {text!r}; known: {SKILLS}")
        specs.append(StepSpec(skill, float(low), float(high)))
    return tuple(specs)


@dataclasses.dataclass(frozen=True)
class SimModel:
    """A candidate's card and its hidden behaviour."""

    card: ModelCard
    competence: np.ndarray   # (len(SKILLS),)
    failure_mix: np.ndarray  # (len(FAILURES),) sums to 1
    over_explain: float
    verbosity: float


def _sim_model(spec: Any, cache: Any = None) -> SimModel:
    """`cache`: the model's cached prices (`sim.prompt_cache`'s entry), or None (no cache discount)."""
    cached = {} if cache is None else {
        "price_cached_in_per_mtok": float(cache["price_cached_in"]),
        **({"price_cache_write_per_mtok": float(cache["price_cache_write"])} if "price_cache_write" in cache else {})}
    card = ModelCard(name=spec["name"], description=spec["description"], context_length=int(spec["context"]),
                     price_in_per_mtok=float(spec["price_in"]), price_out_per_mtok=float(spec["price_out"]),
                     capabilities=tuple((flag, spec[flag]) for flag in ("code", "math", "tool_use")), **cached)
    competence = _parse_pairs(spec["competence"])
    failures = _parse_pairs(spec["failures"])
    if set(competence) != set(SKILLS) or set(failures) != set(FAILURES):
        raise ValueError(f"model {spec['name']}: competence needs {SKILLS}, failures needs {FAILURES}")
    mix = np.array([failures[f] for f in FAILURES], np.float64)
    return SimModel(card=card, competence=np.array([competence[s] for s in SKILLS]), failure_mix=mix / mix.sum(),
                    over_explain=float(spec["over_explain"]), verbosity=float(spec["verbosity"]))


# ------------------------------------------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True)
class SimTask:
    task: Task
    skills: tuple[int, ...]          # skill index of each hidden step
    difficulties: tuple[float, ...]
    answers: tuple[int, ...]         # hidden answer of each step; the last is the task's answer
    split: str
    ood: str | None

    @property
    def num_steps(self) -> int:
        return len(self.skills)


_SUBJECTS = ("river", "train", "budget", "garden", "orbit", "ledger", "harbor", "crystal", "engine", "market",
             "signal", "valley", "library", "voltage", "canyon", "recipe", "glacier", "festival", "archive", "pump")
_TEMPLATES = {
    "arithmetic": "A {a} shop sells {x} items on Monday and {y} more each day after. How many items has the {a} "
                  "shop sold by the time the {b} delivery arrives?",
    "multihop": "Which {a} is connected to the {b} that was founded in the same year as the {c} archive? "
                "Give the name only.",
    "competition_math": "Let f(n) be the number of ways to tile a {x} by {y} {a} board with {b} dominoes. "
                        "Compute f modulo {z}.",
    "multiple_choice": "Which statement about the {a} and the {b} is correct? (A) {x} (B) {y} (C) {z} (D) none. "
                       "Answer with a letter.",
    "theorem": "Using the {a} theorem, find the {b} of a system with parameters {x} and {y}, to the nearest "
               "integer.",
    "discrete_reading": "Passage: the {a} opened in {x}; {y} people visited the {b} and {z} the {c}. "
                        "Question: how many more visited the {b} than the {c}?",
}


def _make_task(rng: np.random.Generator, family: str, spec: Any, index: int, split: str) -> SimTask:
    steps = _parse_steps(spec["steps"])
    a, b, c = rng.choice(_SUBJECTS, 3, replace=False)
    x, y, z = (int(v) for v in rng.integers(2, 999, 3))
    prompt = f"[{family}] " + _TEMPLATES[spec["kind"]].format(a=a, b=b, c=c, x=x, y=y, z=z)
    difficulties = tuple(round(float(rng.uniform(s.low, s.high)), 4) for s in steps)
    answers = tuple(int(v) for v in rng.integers(10, 100_000, len(steps)))
    task = Task(id=f"{family}-{split}-{index:03d}", prompt=prompt, family=family)
    return SimTask(task=task, skills=tuple(SKILLS.index(s.skill) for s in steps), difficulties=difficulties,
                   answers=answers, split=split, ood=spec.get("ood"))


# ---------------------------------------------------------------------------------------------- responses
#
# The response templates make each outcome legible in the text (the information RIVE learns from) and let the
# environment's grader recover what happened from the text alone.

_SKILL_PHRASES = {"plan": "break the problem into parts", "retrieve": "look up the missing fact",
                  "compute": "compute the quantity", "code": "write a short program",
                  "recall": "recall the relevant fact", "format": "state the final answer"}
_EXPLANATION = (" To be thorough, let me restate the problem, the assumptions, every intermediate quantity, "
                "why each is needed and how each could be double-checked, before moving on.")


VARIANTS = {"malformed": 2}  # outcomes with more than one wording (each equally likely)


def render_response(outcome: str, skill: str, step: int, answer: int, final: bool, rng: np.random.Generator,
                    variant: int = 0) -> str:
    """The response text of one outcome (what the chosen model writes). Random content never changes how many
    tokens the environment's feedback to it has, so the DP's token accounting is exact."""
    phrase = _SKILL_PHRASES[skill]
    if outcome in ("progress", "over_explain"):
        body = f"<solution> {answer} </solution>" if final else f"<execute> print({answer}) </execute>"
        text = f"<thought> I will {phrase} for step {step + 1}; the result checks out. </thought> {body}"
        return text + (_EXPLANATION * 2 if outcome == "over_explain" else "")
    if outcome == "constraint":
        wrong = answer + int(rng.integers(1, 50))
        body = f"<solution> {wrong} </solution>" if final else f"<execute> print({wrong}) </execute>"
        return f"<thought> I will {phrase}, ignoring the stated condition to keep it simple. </thought> {body}"
    if outcome == "malformed":
        broken = ("<execute> print(step_value </execute>", "<execute> print(undefined_total) </execute>")[variant]
        return f"<thought> Let me {phrase}. </thought> {broken}"
    if outcome == "drift":
        topic = str(rng.choice(_SUBJECTS))
        return (f"<thought> First some background on the {topic}, which seems related. </thought> "
                f"<execute> print(wikipedia_search('{topic} history')) </execute>")
    if outcome == "stall":
        return ("<thought> Hmm. There are several ways to see this and I am not yet sure which applies; "
                "let me think about it more carefully, considering each possibility in turn, and then decide "
                "on an approach in the next message. </thought>")
    raise ValueError(f"unknown outcome {outcome!r}")


def count_tokens(text: str, block: int = 1) -> int:
    """The environment's token count (words and single punctuation marks), rounded up to whole `block`s."""
    return -(-len(_TOKEN.findall(text)) // block) * block


_TOKEN = re.compile(r"\w+|[^\w\s]")
_PRINT_NUMBER = re.compile(r"<execute>\s*print\((-?\d+)\)\s*</execute>")
_SOLUTION = re.compile(r"<solution>\s*(.*?)\s*</solution>", re.S)
_EXECUTE = re.compile(r"<execute>(.*?)</execute>", re.S)
_SEARCH = re.compile(r"wikipedia_search\('([^']*)'\)")


@dataclasses.dataclass(frozen=True)
class Reply:
    """What the environment makes of a response: its feedback and the effect on the hidden state."""

    feedback: str
    progress: bool        # the current step is done
    proposal: bool        # a solution was proposed
    correct: bool         # ... and it was right
    kind: str             # the feedback's category: observation | error | invalid | correct | wrong


def respond(response: str, answers: Sequence[int], step: int, proposals_left: int) -> Reply:
    """The environment's answer to a response, from its text and the hidden task alone (identity-blind)."""
    solution = _SOLUTION.search(response)
    if solution:
        correct = step == len(answers) - 1 and solution.group(1).strip() == str(answers[-1])
        if correct:
            return Reply("Your answer is correct.", True, True, True, "correct")
        left = proposals_left - 1
        return Reply(f"Your answer is wrong. You have {left} chance{'s' if left != 1 else ''} to propose a "
                     f"solution left.", False, True, False, "wrong")
    execute = _EXECUTE.search(response)
    if not execute:
        return Reply("Observation: I don't understand your input. If you want to execute code, please use "
                     "<execute> YOUR_CODE_HERE </execute>. If you want to give me an answer, please use "
                     "<solution> YOUR_SOLUTION_HERE </solution>.", False, False, False, "invalid")
    number = _PRINT_NUMBER.search(response)
    if number:
        value = int(number.group(1))
        return Reply(f"Observation: {value}", value == answers[step], False, False, "observation")
    search = _SEARCH.search(execute.group(1))
    if search:
        return Reply(f"Observation: Page id \"{search.group(1)}\" does not match any pages. Try another query.",
                     False, False, False, "observation")
    code = execute.group(1)
    if code.count("(") != code.count(")"):
        return Reply("Observation: SyntaxError: '(' was never closed (<stdin>, line 1)", False, False, False, "error")
    name = re.search(r"print\(([A-Za-z_]\w*)\)", code)
    return Reply(f"Observation: NameError: name '{name.group(1) if name else 'x'}' is not defined", False, False,
                 False, "error")


# ------------------------------------------------------------------------------------------------ episodes


@dataclasses.dataclass(frozen=True)
class SimState:
    """Observable (task, history) plus the hidden state (step, wrong proposals, context tokens)."""

    sim_task: SimTask
    history: tuple[Turn, ...] = ()
    step: int = 0
    wrong_proposals: int = 0
    context_tokens: int = 0
    done: bool = False
    success: bool = False

    @property
    def task(self) -> Task:
        return self.sim_task.task


class RouteSim:
    """The environment. Built from `config.sim` (configs/routesim.py)."""

    def __init__(self, sim_config: Any):
        self.config = sim_config
        cache = sim_config.get("prompt_cache")   # None: no prompt cache (the paper's RouteSim)
        unknown = set(cache or ()) - set(sim_config.models)
        if unknown:
            raise ValueError(f"sim.prompt_cache names models {sorted(unknown)} that sim.models lacks")
        self.prompt_cache = cache is not None
        self.models = tuple(_sim_model(spec, (cache or {}).get(key)) for key, spec in sim_config.models.items())
        self.pool = ModelPool(tuple(m.card for m in self.models))
        self.max_turns = int(sim_config.max_turns)
        self.max_proposals = int(sim_config.max_proposals)
        self.sharpness = float(sim_config.sharpness)
        completion = _parse_pairs(sim_config.completion_tokens)
        # Every token count is in whole blocks (usage is reported in blocks), which makes the exact DP's grid over
        # prompt lengths `block` times smaller. (M, O) completion tokens per model and outcome; feedback tokens
        # are counted from the feedback text itself.
        self.block = int(sim_config.token_block)
        self.completion = np.array([[self.block * round(m.verbosity * completion[o] / self.block) for o in OUTCOMES]
                                    for m in self.models], np.int64)
        self.price_in = np.array([m.card.price_in_per_mtok for m in self.models]) / 1e6   # $ per token
        self.price_out = np.array([m.card.price_out_per_mtok for m in self.models]) / 1e6
        # $ per prompt token read from the cache, and per token sent past it (written to it): the input price where
        # the card has none
        self.price_read = np.array([m.card.cache_read_price for m in self.models]) / 1e6
        self.price_write = np.array([m.card.cache_write_price for m in self.models]) / 1e6
        # (M,) whether a model's calls read a prompt cache (a cached price on its card, and a prompt cache at all)
        self.caches = np.array([self.prompt_cache and m.card.price_cached_in_per_mtok is not None
                                for m in self.models])
        self._tasks = self._make_tasks()
        self._by_id = {t.task.id: t for tasks in self._tasks.values() for t in tasks}
        self._outcome_cdfs: dict[tuple[str, int], np.ndarray] = {}   # (task id, step) -> (M, O), see outcome_cdf

    # -- tasks ---------------------------------------------------------------------------------------------

    def _make_tasks(self) -> dict[str, list[SimTask]]:
        tasks: dict[str, list[SimTask]] = {}
        for f_index, (family, spec) in enumerate(sorted(self.config.families.items())):
            for split in SPLITS:
                count = int(spec.get(split, 0) or 0)
                # One generator per (family, split): adding a family never changes another's tasks.
                rng = np.random.default_rng([int(self.config.seed), f_index, SPLITS.index(split)])
                name = f"ood:{spec['ood']}" if spec.get("ood") and split == "test" else split
                tasks.setdefault(name, []).extend(_make_task(rng, family, spec, i, name) for i in range(count))
        return tasks

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._tasks)

    def sim_tasks(self, split: str) -> list[SimTask]:
        if split not in self._tasks:
            raise KeyError(f"unknown split {split!r}; RouteSim has {self.splits}")
        return self._tasks[split]

    def tasks(self, split: str) -> list[Task]:
        return [t.task for t in self.sim_tasks(split)]

    def sim_task(self, task_id: str) -> SimTask:
        return self._by_id[task_id]

    def task_tokens(self, sim_task: SimTask) -> int:
        """Prompt tokens before the first turn: the instructions + the task text."""
        return int(self.config.system_tokens) + count_tokens(sim_task.task.prompt, self.block)

    # -- model behaviour ---------------------------------------------------------------------------------

    def outcome_probs(self, sim_task: SimTask, step: int) -> np.ndarray:
        """(M, O) probabilities of each outcome for each model at the task's `step`."""
        skill, difficulty = sim_task.skills[step], sim_task.difficulties[step]
        competence = np.array([m.competence[skill] for m in self.models])
        p_success = 1.0 / (1.0 + np.exp(-self.sharpness * (competence - difficulty)))     # (M,)
        over = np.array([m.over_explain for m in self.models])
        mix = np.stack([m.failure_mix for m in self.models])                               # (M, F)
        return np.concatenate([(p_success * (1 - over))[:, None], (p_success * over)[:, None],
                               (1 - p_success)[:, None] * mix], axis=1)

    def outcome_cdf(self, sim_task: SimTask, step: int) -> np.ndarray:
        """(M, O) `outcome_probs` cumulated and normalised as `Generator.choice` does it, computed once per (task,
        step): `cdf[m].searchsorted(rng.random(), side="right")` draws what `rng.choice(O, p=probs[m])` draws, draw
        for draw (the rollouts' hot loop, without choice's checks and cumsum at every turn)."""
        key = (sim_task.task.id, step)
        cdf = self._outcome_cdfs.get(key)
        if cdf is None:
            cdf = self.outcome_probs(sim_task, step).cumsum(axis=1)
            cdf /= cdf[:, -1:]
            self._outcome_cdfs[key] = cdf
        return cdf

    # -- the environment -----------------------------------------------------------------------------------

    def reset(self, task_id: str) -> SimState:
        sim_task = self.sim_task(task_id)
        return SimState(sim_task=sim_task, context_tokens=self.task_tokens(sim_task))

    def generate(self, state: SimState, model: str, rng: np.random.Generator) -> tuple[str, int]:
        """The model acts: its response text and completion tokens (the only place model identity matters)."""
        m = self.pool.index(model)
        outcome = int(self.outcome_cdf(state.sim_task, state.step)[m].searchsorted(rng.random(), side="right"))
        variant = int(rng.integers(VARIANTS.get(OUTCOMES[outcome], 1)))
        sim_task = state.sim_task
        text = render_response(OUTCOMES[outcome], SKILLS[sim_task.skills[state.step]], state.step,
                               sim_task.answers[state.step], state.step == sim_task.num_steps - 1, rng, variant)
        return text, int(self.completion[m, outcome])

    def step(self, state: SimState, model: str, rng: np.random.Generator, propensity: float | None = None,
             available: Sequence[str] | None = None) -> SimState:
        if state.done:
            raise ValueError(f"episode of {state.task.id} is over")
        response, completion_tokens = self.generate(state, model, rng)
        return self.apply_response(state, model, response, completion_tokens, propensity, available)

    def apply_response(self, state: SimState, model: str, response: str, completion_tokens: int,
                       propensity: float | None = None, available: Sequence[str] | None = None) -> SimState:
        """Advances the episode by a response; everything but the cost ignores `model` (identity-blind)."""
        sim_task = state.sim_task
        reply = respond(response, sim_task.answers, state.step, self.max_proposals - state.wrong_proposals)
        m = self.pool.index(model)
        cost = self.input_cost(state, m) + self.price_out[m] * completion_tokens
        wrong = state.wrong_proposals + (reply.proposal and not reply.correct)
        turns = len(state.history) + 1
        done = reply.correct or wrong >= self.max_proposals or turns >= self.max_turns
        turn = Turn(model=model, response=response, feedback=reply.feedback, prompt_tokens=state.context_tokens,
                    completion_tokens=completion_tokens, cost=float(cost), done=done, propensity=propensity,
                    available=None if available is None else tuple(available), **self.cache_usage(state, m))
        return dataclasses.replace(
            state, history=state.history + (turn,), step=state.step + (reply.progress and not reply.proposal),
            wrong_proposals=wrong, done=done, success=reply.correct,
            context_tokens=state.context_tokens + completion_tokens + self.feedback_tokens(reply.feedback))

    def cached_tokens(self, state: SimState, m: int) -> int:
        """Prompt tokens of model m's turn in `state` that its cache holds: the previous turn's whole prompt when m
        served it and has a cached price, else none."""
        if not self.caches[m] or not state.history or state.history[-1].model != self.models[m].card.name:
            return 0
        return state.history[-1].prompt_tokens

    def input_cost(self, state: SimState, m: int) -> float:
        """Dollars model m's turn in `state` pays for its prompt."""
        if not self.prompt_cache:
            return self.price_in[m] * state.context_tokens
        cached = self.cached_tokens(state, m)
        return self.price_read[m] * cached + self.price_write[m] * (state.context_tokens - cached)

    def cache_usage(self, state: SimState, m: int) -> dict[str, int]:
        """The turn's `cached_tokens` and, where model m pays a premium to write the cache, `cache_write_tokens` (the
        rest of its prompt); nothing without a prompt cache, so those turns are as they always were."""
        if not self.prompt_cache:
            return {}
        cached = self.cached_tokens(state, m)
        written = state.context_tokens - cached if self.models[m].card.price_cache_write_per_mtok is not None else None
        return {"cached_tokens": cached, "cache_write_tokens": written}

    def feedback_tokens(self, feedback: str) -> int:
        return count_tokens(feedback, self.block)


@functools.lru_cache(maxsize=4)
def _cached_sim(config_json: str) -> RouteSim:
    return RouteSim(ml_collections.ConfigDict(json.loads(config_json)))


def make_routesim(sim_config: Any) -> RouteSim:
    """A RouteSim for `config.sim`, cached by content (building the task manifests takes a moment)."""
    return _cached_sim(sim_config.to_json())
