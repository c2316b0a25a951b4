"""What every request of the routing proxy shares (`app.py` serves it over HTTP): the router, the backends, the
recorder, the backends' health, the exploration budget, the hot-swapped router (`ServedRouter`) and the sessions'
order (`Sessions`)."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import os
import time
from collections.abc import Callable, Sequence

import ml_collections
import numpy as np
from absl import logging
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rivet_jax.data.converters.common import CallUsage, tokens_and_cost
from rivet_jax.data.schema import Turn
from rivet_jax.data.validation import DataError, Where
from rivet_jax.router import Router
from rivet_jax.serve.conversation import Conversation, session_key
from rivet_jax.serve.policy import Budget, Choice, Exploration
from rivet_jax.serve.recorder import Recorder
from rivet_jax.serve.served import ServedRouter, warm_up
from rivet_jax.serve.upstream import Backend, Health, Reply, redact, response_text

__all__ = ["Proxy", "Sessions", "error_response"]

_CHARS_PER_TOKEN = 4  # the usual rule of thumb, for a backend that reports no usage
INLINE_CHARS = 256 << 10  # a conversation longer than this is scored in a thread even by the hashing encoder


def _size(conversation: Conversation) -> int:
    return len(conversation.task) + sum(len(t["response"]) + len(t["feedback"]) for t in conversation.history)


class Sessions:
    """One request at a time per session: a session's turns are recorded in the order they are served, a retry of
    a turn still in flight waits for it (then asks it again: `Recorder.record` replaces it), and an outcome waits for
    the turn being served. Each wait is bounded (`hold`'s timeout: a turn in flight for longer is a 409)."""

    def __init__(self):
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}   # session -> (its lock, holders and waiters)

    async def hold(self, session: str, timeout_s: float) -> Callable[[], None] | None:
        """The session held (call the returned function to let it go), or None after `timeout_s` of waiting."""
        lock, users = self._locks.get(session, (asyncio.Lock(), 0))
        self._locks[session] = (lock, users + 1)
        try:
            await asyncio.wait_for(lock.acquire(), timeout_s)
        except TimeoutError:
            self._leave(session)
            return None
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                lock.release()
                self._leave(session)
        return release

    async def hold_each(self, sessions: Sequence[str], timeout_s: float) -> Callable[[], None] | None:
        """Every one of `sessions` held, in order (one function lets them all go), or None after `timeout_s`. A
        request holds one session, so holding several never waits in a cycle."""
        releases = []
        deadline = time.monotonic() + timeout_s
        for session in dict.fromkeys(sessions):
            release = await self.hold(session, max(0.0, deadline - time.monotonic()))
            if release is None:
                for held in releases:
                    held()
                return None
            releases.append(release)

        def release_all() -> None:
            for held in reversed(releases):
                held()
        return release_all

    def _leave(self, session: str) -> None:
        lock, users = self._locks[session]
        if users <= 1:
            del self._locks[session]
        else:
            self._locks[session] = (lock, users - 1)


@dataclasses.dataclass
class Proxy:
    """Everything a request needs; one per server. `workdir`: where the served router came from (its deployment is
    watched for a hot swap when `config.router_stage` is ''; None: the router is fixed)."""

    router: Router
    backends: dict[str, Backend]     # pool order
    recorder: Recorder
    config: ml_collections.ConfigDict
    workdir: str | os.PathLike | None = None
    health: Health = dataclasses.field(init=False)
    rng: np.random.Generator = dataclasses.field(init=False)

    def __post_init__(self):
        self.health = Health(list(self.backends), self.config.cooloff_s)
        self.rng = np.random.default_rng(self.config.seed)
        budget = float(self.config.get("exploration_budget", 0.0))
        self.budget = Budget(Exploration.of(self.config), budget if budget > 0 else None)
        self.served = ServedRouter(self.router, self.workdir, self.config.get("router_stage", ""), list(self.backends))
        self.sessions = Sessions()
        self.session_key = session_key(self.recorder.logdir)   # keyed default session ids (conversation.session_id)
        self.background: dict[str, dict] = {}   # the background tasks' failures (app.py `_forever`): /healthz
        self._pending: list[tuple[Conversation, list[str], str | None, asyncio.Future]] = []
        self._draining = False
        # The hashing encoder holds the GIL for its ~1 ms, so a thread would add a handoff (~1 ms measured) and
        # overlap nothing; a neural encoder's tens of ms would stall every other request's I/O on the event loop.
        mode = self.config.get("scoring", "auto")
        self._in_thread = mode == "thread" or (mode == "auto" and self.router.encoder.name != "hashing")

    async def scores(self, conversation: Conversation, candidates: list[str], family: str | None = None,
                     lam: float | None = None) -> tuple[dict[str, float], str, float]:
        """Q_route of each candidate at this conversation's state (its task of `family`, where known: a router
        recentred per family reads it) for cost weight `lam` (None: the router's own), the version of the router
        that scored it and the lambda it scored for.

        On the event loop (`config.scoring`), at once: nothing else runs meanwhile. In a thread, one scoring at a
        time (the neural encoders' tokenizers are not thread-safe, and on CPU concurrent scorings would only share
        the same cores), and the requests that arrive while one runs are scored together next, in one encoder pass
        and one network call."""
        if not self._in_thread and _size(conversation) <= INLINE_CHARS:
            return self._score_batch([(conversation, candidates, family, lam, None)], self.served.current)[0]
        future = asyncio.get_running_loop().create_future()
        self._pending.append((conversation, candidates, family, lam, future))
        if not self._draining:
            self._draining = True
            asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                current = self.served.current   # one router for the whole batch, whatever a swap does meanwhile
                try:
                    rows = await asyncio.to_thread(self._score_batch, batch, current)
                except Exception:  # noqa: BLE001 - one bad state must not fail the others: each alone
                    rows = [await asyncio.to_thread(self._score_one, item, current) for item in batch]
                for (*_, future), row in zip(batch, rows):
                    if isinstance(row, BaseException):
                        future.set_exception(row)
                    else:
                        future.set_result(row)
        finally:
            self._draining = False

    def _score_batch(self, batch, current: tuple[Router, str]) -> list[tuple[dict[str, float], str, float]]:
        router, version = current
        rows: list = [None] * len(batch)
        for lam in dict.fromkeys(item[3] for item in batch):   # one network call per lambda asked for
            at = [i for i, item in enumerate(batch) if item[3] == lam]
            scoring = router if lam is None else router.at_lambda(lam)
            q = scoring.scores([(batch[i][0].task, batch[i][0].history) for i in at], [batch[i][1] for i in at],
                               [batch[i][2] for i in at])
            for i, row in zip(at, q):
                rows[i] = ({name: float(row[router.pool.index(name)]) for name in batch[i][1]}, version, scoring.lam)
        return rows

    def _score_one(self, item, current) -> tuple[dict[str, float], str] | BaseException:
        try:
            return self._score_batch([item], current)[0]
        except Exception as error:  # noqa: BLE001 - handed to the request it belongs to
            return error

    def warm_up(self) -> None:
        warm_up(self.served.current[0])

    def fault(self, name: str, why: str) -> None:
        """A backend failed a call: down for the cool-off. `why` is shown (log, 502s, /healthz): redacted."""
        why = redact(why, tuple(backend.key() for backend in self.backends.values()))
        logging.warning("backend %s faulted (%s); down for %g s", name, why, self.config.cooloff_s)
        self.health.mark_down(name, why)

    def refused(self, request: Request) -> Response | None:
        """The 401/403 answer for a request the proxy must not serve (module docstring), or None."""
        origin = request.headers.get("origin")
        if origin is not None and origin not in tuple(self.config.get("allowed_origins", ())):
            return error_response(403, f"cross-origin requests from {origin!r} are refused (config.allowed_origins)",
                          "permission_error")
        variable = self.config.get("auth_token_env", "")
        if variable:
            token = os.environ.get(variable, "")
            given = request.headers.get("authorization", "")
            if not token or not hmac.compare_digest(given.encode("utf-8", "replace"),
                                                    f"Bearer {token}".encode("utf-8")):
                return error_response(401, "missing or wrong bearer token (Authorization: Bearer <the proxy's token>)",
                              "authentication_error")
        return None

    async def record(self, name: str, reply: Reply, conversation: Conversation, choice: Choice, version: str,
                     candidates: list[str], session: str, family: str | None, start: float,
                     lam: float | None = None) -> None:
        """Records the turn `name` served (its call began at perf_counter `start`; chosen for cost weight `lam`),
        fsynced before returning."""
        turn = self.turn(name, reply, conversation, choice, candidates, time.perf_counter() - start, version, lam)
        _, index = await asyncio.to_thread(self.recorder.record, session, conversation.task,
                                           len(conversation.history), turn, family)
        if index == 0:
            self.budget.opened()
            report = self.budget.report()
            if report["episodes"] % 100 == 0 and not self.budget.exploration.greedy:
                logging.info("exploration so far: %d episodes, %d of %d decisions explored, expected shortfall "
                             "%.4f per episode (budget %s)", report["episodes"], report["explored"],
                             report["decisions"], report["expected_shortfall_per_episode"],
                             report["budget_per_episode"])

    def turn(self, name: str, reply: Reply, conversation: Conversation, choice: Choice, candidates: list[str],
             latency_s: float, version: str | None = None, lam: float | None = None) -> Turn:
        """The served turn as the trajectory schema records it (feedback arrives with the next request)."""
        try:
            text = response_text(reply.message)
        except DataError:  # e.g. a tool call streamed without an id: keep the content
            text = reply.message.get("content") or ""
        pool = self.served.current[0].pool
        card = pool.cards[pool.index(name)]
        try:
            call = tokens_and_cost(reply.usage, card, Where(f"<{name}>", None), "usage")
        except DataError as error:
            logging.warning("%s; tokens estimated at %d characters per token", error, _CHARS_PER_TOKEN)
            prompt_chars = len(json.dumps(conversation.body.get("messages"), ensure_ascii=False))
            prompt_tokens, completion_tokens = prompt_chars // _CHARS_PER_TOKEN, len(text) // _CHARS_PER_TOKEN
            cost = ((card.price_in_per_mtok or 0.0) * prompt_tokens +
                    (card.price_out_per_mtok or 0.0) * completion_tokens) / 1e6
            call = CallUsage(prompt_tokens, completion_tokens, cost)
        served_as_drawn = name == choice.order[0]
        return Turn(model=name, response=text, feedback="", propensity=choice.propensity if served_as_drawn else None,
                    available=tuple(candidates), latency_s=round(latency_s, 6), router=version, lam=lam,
                    **call.turn_fields())


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> Response:
    """An error in OpenAI's shape, so that clients raise their usual exception with the message."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=status)
