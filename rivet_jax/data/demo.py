"""A small seeded corpus of logged multi-turn episodes: the default data when no logs are given, and test data.

Four models of different price and per-skill competence act on tasks that need a hidden sequence of skills. A
behaviour policy picks a model uniformly at random every turn (propensity 1/M). A step succeeds with a probability
set by the model's competence at the step's skill; the response text shows whether it did (a checked computation
versus an error or a stall), and the environment's feedback follows from the response alone. An episode ends when
a solution is proposed or after `max_turns`; cost is price x tokens as in Assumption A.2 (ii).

It exists so that the whole pipeline runs on a fresh machine without data; it is not a benchmark (no oracle).
"""

from __future__ import annotations

import numpy as np

from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn

SKILLS = ("compute", "retrieve", "reason", "format")

# name, description, context, $ in / Mtok, $ out / Mtok, competence per skill (compute, retrieve, reason, format)
_MODELS = (
    ("atlas-xl", "Large frontier model: strong multi-step reasoning and computation; slow and the most expensive.",
     128_000, 15.0, 60.0, (0.92, 0.85, 0.93, 0.70)),
    ("coder-m", "Mid-sized model tuned for code and arithmetic through a Python tool; weak at factual recall.",
     32_000, 1.0, 3.0, (0.90, 0.45, 0.60, 0.85)),
    ("sage-s", "Small general model with broad factual knowledge; careful formatting; weak at long computation.",
     16_000, 0.3, 0.9, (0.45, 0.85, 0.55, 0.90)),
    ("flash-xs", "Tiny fast model, the cheapest in the pool; fine for simple formatting, unreliable otherwise.",
     8_000, 0.05, 0.1, (0.35, 0.35, 0.25, 0.80)),
)

_FAMILIES = {
    "arithmetic": ("compute", "format"),
    "lookup": ("retrieve", "format"),
    "multihop": ("retrieve", "reason", "format"),
    "proof": ("reason", "compute", "format"),
}

# (response fragment, environment feedback): the failure modes a failed step shows.
_FAILURES = (
    ("<execute> print(undefined_name) </execute>", "Observation: NameError: name 'undefined_name' is not defined"),
    ("<execute> def f(: </execute>", "Observation: SyntaxError: invalid syntax"),
    ("I think the answer could be many things.", "Observation: no action was taken; use <execute> or <solution>."),
)

_WORDS = ("river", "train", "budget", "garden", "orbit", "ledger", "harbor", "crystal", "engine", "market",
          "signal", "valley", "library", "voltage", "canyon", "recipe")


def demo_pool() -> ModelPool:
    return ModelPool(tuple(
        ModelCard(name=name, description=description, context_length=context, price_in_per_mtok=p_in,
                  price_out_per_mtok=p_out, capabilities=(("code", name in ("atlas-xl", "coder-m")),
                                                          ("tool_use", None if name == "flash-xs" else True)))
        for name, description, context, p_in, p_out, _ in _MODELS))


def _task(rng: np.random.Generator, index: int) -> tuple[Task, tuple[str, ...]]:
    family = list(_FAMILIES)[rng.integers(len(_FAMILIES))]
    a, b = rng.choice(_WORDS, 2, replace=False)
    numbers = rng.integers(2, 999, size=2)
    prompt = (f"[{family}] A {a} and a {b} are linked by {numbers[0]} and {numbers[1]}. "
              f"Work out the {family} question about the {a} step by step and give the final answer.")
    return Task(id=f"demo-{index:05d}", prompt=prompt, family=family), _FAMILIES[family]


def _response(rng: np.random.Generator, skill: str, solved: bool, final: bool) -> tuple[str, str]:
    """The response text and the environment's feedback; both follow from the outcome of the step only."""
    if final:
        answer = "<solution> 42 </solution>" if solved else "<solution> unsure, maybe 17 </solution>"
        return f"<thought> Everything is in place, I will {skill} and submit. </thought> {answer}", ""
    if solved:
        return (f"<thought> I will {skill} this part carefully. </thought> "
                f"<execute> result = {skill}_step(); print(result) </execute>",
                f"Observation: {skill} step done, the value is consistent and verified.")
    failure, feedback = _FAILURES[rng.integers(len(_FAILURES))]
    return f"<thought> Let me try to {skill}. </thought> {failure}", feedback


def demo_episodes(num_episodes: int, seed: int = 0, max_turns: int = 6) -> list[Episode]:
    """`num_episodes` logged episodes under a uniform-random behaviour policy over `demo_pool()`."""
    rng = np.random.default_rng(seed)
    pool = demo_pool()
    competence = {name: dict(zip(SKILLS, comp)) for name, *_, comp in _MODELS}
    prices = {card.name: (card.price_in_per_mtok, card.price_out_per_mtok) for card in pool.cards}
    episodes = []
    for index in range(num_episodes):
        task, steps = _task(rng, index)
        context_tokens = len(task.prompt.split())
        step, turns, outcome = 0, [], 0
        while len(turns) < max_turns:
            model = pool.names[rng.integers(len(pool))]
            skill = steps[step]
            final = step == len(steps) - 1
            solved = bool(rng.random() < competence[model][skill])
            response, feedback = _response(rng, skill, solved, final)
            completion = len(response.split()) + int(rng.integers(0, 40))
            p_in, p_out = prices[model]
            turns.append(Turn(model=model, response=response, feedback=feedback, prompt_tokens=context_tokens,
                              completion_tokens=completion, cost=(p_in * context_tokens + p_out * completion) / 1e6,
                              propensity=1.0 / len(pool)))
            context_tokens += completion + len(feedback.split())
            step += solved and not final
            if final:
                outcome = int(solved)
                break
        episodes.append(Episode(episode_id=f"{task.id}-0", task=task, turns=tuple(turns), outcome=outcome))
    return episodes
