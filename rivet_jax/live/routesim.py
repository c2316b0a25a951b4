"""RouteSim as a live agent, over real HTTP: the test bed where every decision of the loop has a ground truth.

An agent (`play`) solves RouteSim tasks through the routing proxy with the official `openai` client: the task is
the first user message, each model response comes back as the assistant message, and the environment's answer to it
(RouteSim's feedback) is the next user message; when the episode ends the agent posts its outcome. Behind the proxy,
one fake upstream (`upstream_app`) answers for every RouteSim model exactly as the simulator would: the episode's
hidden state and its random generator live in `LiveEpisodes` (the request's `user` field names the episode), so a
response, its tokens and its cost are the ones `RouteSim.step` draws, and a fixed policy played live gives the
simulator's own episodes (tests/test_live.py).

The proxy reads a conversation as the logs' converter does (`serve.conversation.read_request`), so the router sees
each feedback as `[user] <feedback>`. `ServedPolicy` is a router as the proxy serves it, reading the same
conversation through the same code: rolled out in the simulator it is what the proxy does, which is how the live
experiment's exact values are computed.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.parse
from typing import Sequence

import httpx
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rivet_jax.data.schema import Episode, Turn
from rivet_jax.envs.base import Request as Decision
from rivet_jax.envs.routesim import RouteSim, SimState
from rivet_jax.router import Router
from rivet_jax.serve.conversation import read_request
from rivet_jax.serve.policy import GREEDY, Budget, Exploration

__all__ = ["chat_messages", "served_state", "ServedPolicy", "LiveEpisodes", "upstream_app", "play"]


def chat_messages(prompt: str, turns: Sequence[Turn]) -> list[dict]:
    """The conversation the agent sends before its next turn: the task, then each completed turn's response
    (assistant) and the environment's answer to it (user)."""
    messages = [{"role": "user", "content": prompt}]
    for turn in turns:
        messages += [{"role": "assistant", "content": turn.response}, {"role": "user", "content": turn.feedback}]
    return messages


def served_state(prompt: str, turns: Sequence[Turn]) -> tuple[str, list[dict]]:
    """(task, history) as the proxy reads the agent's conversation: what the served router scores."""
    conversation = read_request({"messages": chat_messages(prompt, turns)})
    return conversation.task, conversation.history


class ServedPolicy:
    """A router as the proxy serves it (module docstring): scores at `served_state`, greedy or drawing with the
    proxy's `exploration` from its own generator (so the environment's draws stay those of the greedy policy's
    episodes until the two part: common random numbers for the exploration cost), under the proxy's exploration
    `budget` per episode (`serve.policy.Budget`; None: none). A budget's state runs on from episode to episode as in
    the proxy, so a budgeted policy is `sequential`: its episodes are rolled out one after another (`exact_value`)."""

    def __init__(self, router: Router, exploration: Exploration = GREEDY, seed: int = 0, name: str = "served",
                 budget: float | None = None):
        self.router, self.exploration, self.name = router, exploration, name
        self.budget = Budget(exploration, budget)
        self.sequential = budget is not None and not exploration.greedy
        self.rng = np.random.default_rng(seed)

    def act(self, task, history, available, rng):
        return self.act_batch([(task, history, available, rng)])[0]

    def act_batch(self, requests: Sequence[Decision]) -> list[tuple[str, float]]:
        q = self.router.scores([served_state(task.prompt, history) for task, history, _, _ in requests],
                               [list(available) for _, _, available, _ in requests],
                               [task.family for task, _, _, _ in requests])   # the driver's family header  (B, M)
        out = []
        for row, (_, history, available, _) in zip(q, requests):
            choice = self.budget.choose({name: float(row[self.router.pool.index(name)]) for name in available},
                                        self.rng)
            if not history:   # the episode opened: the budget grows by its share (after its first turn, as the proxy)
                self.budget.opened()
            out.append((choice.order[0], choice.propensity))
        return out


@dataclasses.dataclass
class LiveEpisodes:
    """The agent's open episodes by session: their hidden states and generators, which the upstream answers from."""

    sim: RouteSim
    states: dict[str, SimState] = dataclasses.field(default_factory=dict)
    rngs: dict[str, np.random.Generator] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def upstream_app(live: LiveEpisodes) -> Starlette:
    """One OpenAI-compatible upstream answering for every RouteSim model (`body.model`) in the episode the request's
    `user` field names: the response text and completion tokens `RouteSim.generate` draws, prompt tokens the
    episode's context (with a prompt cache, the part it read in `prompt_tokens_details.cached_tokens`), and the
    simulator's cost as `usage.cost`."""
    sim = live.sim

    async def chat(request: Request):
        body = json.loads(await request.body())
        model, session = body.get("model"), body.get("user")
        with live.lock:
            state, rng = live.states.get(session), live.rngs.get(session)
            if state is None or model not in sim.pool:
                return JSONResponse({"error": {"message": f"no live episode {session!r} or no model {model!r}"}},
                                    status_code=400)
            text, completion = sim.generate(state, model, rng)
        m = sim.pool.index(model)
        cost = float(sim.input_cost(state, m) + sim.price_out[m] * completion)
        usage = {"prompt_tokens": state.context_tokens, "completion_tokens": completion,
                 "total_tokens": state.context_tokens + completion, "cost": cost}
        cache = sim.cache_usage(state, m)   # with a prompt cache, the tokens it read as a provider reports them
        if cache:
            usage["prompt_tokens_details"] = {"cached_tokens": cache["cached_tokens"]}
            if cache["cache_write_tokens"] is not None:
                usage["cache_creation_input_tokens"] = cache["cache_write_tokens"]
        return JSONResponse({"id": f"{session}-{len(state.history)}", "object": "chat.completion", "created": 0,
                             "model": model, "usage": usage, "choices": [
                                 {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def play(url: str, live: LiveEpisodes, task_ids: Sequence[str], seeds: Sequence[Sequence[int]],
         sessions: Sequence[str], token: str = "unused") -> list[Episode]:
    """Each task played as one episode through the proxy at `url` (its session `sessions[k]`, the simulator's draws
    from `default_rng(seeds[k])`), its outcome posted at the end: the episodes as the simulator saw them (each turn
    with the propensity the proxy reported)."""
    import openai  # deferred: only the live driver needs the client

    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    sim, episodes = live.sim, []
    for task_id, seed, session in zip(task_ids, seeds, sessions):
        state = sim.reset(task_id)
        with live.lock:
            live.states[session], live.rngs[session] = state, np.random.default_rng(list(seed))
        while not state.done:
            raw = client.chat.completions.with_raw_response.create(
                model="rivet", messages=chat_messages(state.task.prompt, state.history), user=session,
                extra_headers={"x-rivet-session": session, "x-rivet-task-family": state.task.family or ""})
            reply, model = raw.parse(), raw.headers["x-rivet-model"]
            propensity = raw.headers.get("x-rivet-propensity", "fallback")
            state = sim.apply_response(state, model, reply.choices[0].message.content or "",
                                       reply.usage.completion_tokens,
                                       None if propensity == "fallback" else float(propensity))
            with live.lock:
                live.states[session] = state
        answer = httpx.post(f"{url}/v1/episodes/{urllib.parse.quote(session, safe='')}/outcome",
                            json={"outcome": int(state.success)}, headers={"authorization": f"Bearer {token}"})
        answer.raise_for_status()
        with live.lock:
            del live.states[session], live.rngs[session]
        episodes.append(Episode(episode_id=session, task=state.task, turns=state.history,
                                outcome=int(state.success)))
    return episodes
