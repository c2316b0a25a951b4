"""What the proxy records: every served turn, in the trajectory schema the router trains on.

Files under the log directory:

- `wal.jsonl`: the write-ahead log. Every event (an episode opened, a turn served, feedback arrived, an episode
  closed) is one JSON line, flushed and fsynced before the request it belongs to is answered, so a crash or a
  SIGKILL loses no recorded turn. On start the log is replayed: the episodes that were open are open again, and
  the log is compacted to just them.
- `episodes.jsonl`: closed episodes with an outcome (`POST /v1/episodes/{session}/outcome`), one `Episode` per
  line: `launch.validate_data` reads it and `launch.train` trains on it as it is.
- `unfinished.jsonl`: episodes closed without a usable outcome, kept apart and never trained on: idle for longer
  than `episode_timeout_s` (`reason: "expired"`), left when the client sent a conversation that does not continue
  the recorded one (`"diverged"`: edited or regenerated history, or a new conversation on the same session), or
  begun mid-conversation on turns this proxy did not serve (`"began mid-conversation"`, whatever its outcome: the
  earlier turns' models are unknown). Each line is the episode's record with `outcome` (a number or null) and
  `reason`.

Every event is checked before it is written: it must read back, through the trajectory schema, as what was meant
(a turn the schema would refuse, e.g. an upstream reply whose content is not text, raises `UnrecordableTurn` and
is not served). A write that fails (`journal.StorageError`: a full disk) changes nothing, in memory or on disk.
On start, a bad line of the write-ahead log is quarantined to `wal.quarantine.jsonl` with its line number and why
(the other events still replay), and a torn last line of any of the files (a write cut short by a crash) is cut
off and kept in `<file>.torn`. The directory is locked for one proxy at a time (`journal.DirectoryLock`); files are
framed as `journal` says.

A turn's feedback is what the client sends after the model's response: the tool results and user messages that the
next request carries after that assistant message. It is filled in when that request arrives (a `feedback` event).

A request that asks the episode's last turn again (its conversation as it was before that turn: a client that timed
out and retried, as the OpenAI SDKs do) is a retry, not a divergence: the new answer, the one the client goes on
from, replaces the last turn (a `replace` event), so the turn is recorded once. Only within a session the client
names: without one, an identical request is another agent starting alike (`resolve`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Callable

from absl import logging

from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.schema import Episode, ModelPool, Task, Turn
from rivet_jax.data.converters.openai_chat import prompt_task_id
from rivet_jax.data.validation import DataError
from rivet_jax.serve.journal import DirectoryLock, Journal, encode_record, read_lines, repair_torn_tail

__all__ = ["OpenEpisode", "Recorder", "NoOpenEpisodeError", "UnrecordableTurn"]

WAL = "<write-ahead log>"


class NoOpenEpisodeError(KeyError):
    """An outcome posted for a session with no open episode (HTTP 404)."""


class UnrecordableTurn(ValueError):
    """A served turn the trajectory schema would not read back (e.g. a response that is not text): not recorded,
    and its reply not served (the backend's fault)."""


@dataclasses.dataclass
class OpenEpisode:
    episode_id: str
    session: str
    task: Task
    offset: int                 # turns of the conversation before this proxy served one (0: it served them all)
    turns: list[Turn]
    updated: float              # time of the last event, for expiry

    @property
    def length(self) -> int:
        """Completed turns of the conversation, the ones before `offset` included."""
        return self.offset + len(self.turns)


class Recorder:
    """The open episodes by session, and the files they are recorded in (module docstring). Thread-safe."""

    def __init__(self, logdir: str | os.PathLike, pool: ModelPool, clock: Callable[[], float] = time.time):
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.pool = pool
        self.clock = clock
        self.wal_path = self.logdir / "wal.jsonl"
        self.episodes_path = self.logdir / "episodes.jsonl"
        self.unfinished_path = self.logdir / "unfinished.jsonl"
        self.quarantine_path = self.logdir / "wal.quarantine.jsonl"
        self.open: dict[str, OpenEpisode] = {}
        self._lock = threading.Lock()
        self._directory = DirectoryLock(self.logdir)
        try:
            for path in (self.episodes_path, self.unfinished_path):
                _repair(path)
            self._recover()
            self._wal = Journal(self.wal_path)
            self._episodes = Journal(self.episodes_path)
            self._unfinished = Journal(self.unfinished_path)
        except BaseException:
            self._directory.release()
            raise

    def close_files(self) -> None:
        with self._lock:
            for journal in (self._wal, self._episodes, self._unfinished):
                journal.close()
            self._directory.release()

    # ------------------------------------------------------------------------------------------- per request

    def observe(self, session: str, task: str, history: list[dict[str, str]]) -> None:
        """A request of `session` arrived with `history` (one {"response", "feedback"} per completed turn): the last
        recorded turn gets its feedback; a conversation that does not continue the open episode (another task, a
        different number of turns, or any served response or recorded feedback changed) closes it."""
        with self._lock:
            episode = self.open.get(session)
            if episode is None:
                return
            if _is_retry(episode, task, history):   # its last turn asked again: `record` replaces that turn
                episode.updated = self.clock()
                return
            why = _divergence(episode, task, history)
            if why is not None:
                self._close(episode, None, f"diverged: {why}")
                return
            feedback = history[-1]["feedback"] if history else ""
            if episode.turns and episode.turns[-1].feedback != feedback:
                self._log({"event": "feedback", "episode": episode.episode_id, "index": len(episode.turns) - 1,
                           "feedback": feedback})
                episode.turns[-1] = dataclasses.replace(episode.turns[-1], feedback=feedback)
            episode.updated = self.clock()

    def last_call(self, session: str, turns: int) -> tuple[str, int] | None:
        """(model, prompt tokens) of the last turn of `session`'s open episode, where the conversation asking has
        `turns` completed turns and this proxy served the last of them (what a cache-aware router reads: whose
        prompt cache holds what); else None."""
        with self._lock:
            episode = self.open.get(session)
            if episode is None or not episode.turns or episode.length != turns:
                return None
            return episode.turns[-1].model, episode.turns[-1].prompt_tokens

    def family(self, session: str) -> str | None:
        """The task family the session's open episode was opened with (None: no open episode, or none given)."""
        with self._lock:
            episode = self.open.get(session)
            return None if episode is None else episode.task.family

    def resolve(self, session: str, task: str, history: list[dict[str, str]]) -> str:
        """The session key of a conversation the client gave no session id (`session`: the task's hash): the open
        episode this history continues, else a key no open episode holds (`session`, `session~2`, ...), so that
        two agents that start alike are two episodes. Its turns are told apart by content, not by count."""
        with self._lock:
            same = [key for key in self.open if key == session or key.startswith(session + "~")]
            for key in same:
                if _divergence(self.open[key], task, history) is None:
                    return key
            key, k = session, 1
            while key in self.open:
                k += 1
                key = f"{session}~{k}"
            return key

    def record(self, session: str, task: str, history_length: int, turn: Turn,
               family: str | None = None) -> tuple[str, int]:
        """Records a served turn (fsynced before returning): (episode id, the turn's index in the episode). `family`:
        the task family of an episode this turn opens (the split draws per family).
        UnrecordableTurn when the schema would not read the turn back; StorageError when it cannot be written
        (nothing changed either way)."""
        with self._lock:
            episode = self.open.get(session)
            if episode is None:
                now = self.clock()
                episode = OpenEpisode(f"{session}@{now:.6f}", session, Task(prompt_task_id(task), task, family),
                                      history_length, [], now)
            retry = bool(episode.turns) and history_length == episode.length - 1
            event = {"event": "replace" if retry else "turn", "episode": episode.episode_id, "turn": turn.to_json()}
            _check_turn(event, episode.task, self.pool)
            if session not in self.open:
                self._log({"event": "open", "episode": episode.episode_id, "session": session,
                           "task": episode.task.to_json(), "offset": history_length})
                self.open[session] = episode
            self._log(event)
            if retry:   # the answer the client received is the one its conversation goes on from: recorded once
                episode.turns[-1] = turn
            else:
                episode.turns.append(turn)
            episode.updated = self.clock()
            return episode.episode_id, len(episode.turns) - 1

    def close(self, session: str, outcome: float) -> Episode:
        """Closes the session's open episode with `outcome` (checked by the caller) and writes it out."""
        with self._lock:
            episode = self.open.get(session)
            if episode is None:
                raise NoOpenEpisodeError(session)
            reason = None if episode.offset == 0 else (f"began mid-conversation: {episode.offset} earlier turns "
                                                       f"were not served by this proxy")
            return self._close(episode, outcome, reason)

    def expire(self, timeout_s: float) -> list[str]:
        """Closes, outcome unknown, every episode idle for more than `timeout_s`; their sessions."""
        with self._lock:
            now = self.clock()
            stale = [e for e in self.open.values() if now - e.updated > timeout_s]
            for episode in stale:
                self._close(episode, None, f"expired: no request or outcome for {now - episode.updated:.0f} s")
            return [e.session for e in stale]

    # ------------------------------------------------------------------------------------------------ files

    def _close(self, episode: OpenEpisode, outcome: float | None, reason: str | None) -> Episode | None:
        """Writes the episode to episodes.jsonl (an outcome and no reason) or unfinished.jsonl, then logs its close;
        the episode stays open if the first write fails (StorageError). A failed close event leaves the episode
        written and, on the next start, not reopened (the output files are read for the ids they hold)."""
        record = None
        if outcome is not None and reason is None:
            record = Episode(episode.episode_id, episode.task, tuple(episode.turns), outcome)
            self._episodes.append(record.to_json())
        else:
            self._unfinished.append({
                "episode_id": episode.episode_id, "task": episode.task.to_json(),
                "turns": [turn.to_json() for turn in episode.turns], "outcome": outcome, "reason": reason})
            logging.info("episode %s kept apart: %s", episode.episode_id, reason)
        del self.open[episode.session]
        try:
            self._log({"event": "close", "episode": episode.episode_id})
        except OSError as error:
            logging.warning("episode %s is written, but its close could not be logged (%s)", episode.episode_id, error)
        return record

    def _log(self, event: dict) -> None:
        event["time"] = self.clock()
        self._wal.append(event)

    def _recover(self) -> None:
        """Replays the write-ahead log into `open` and compacts it to the open episodes' events; a bad line is
        quarantined (module docstring)."""
        episodes: dict[str, OpenEpisode] = {}
        events: dict[str, list[dict]] = {}
        quarantined = []
        for line in read_lines(self.wal_path):
            why = line.error
            if why is None:
                try:
                    _apply(line.record, episodes, self.pool)
                except (DataError, KeyError, TypeError, ValueError, IndexError) as error:
                    why = f"{type(error).__name__}: {error}"
            elif line.torn:  # cut short by a crash: nothing was answered on it
                why = f"torn: {why}"
            if why is not None:
                logging.warning("%s:%d: an event that does not read is quarantined to %s (%s)", self.wal_path,
                                line.number, self.quarantine_path, why)
                quarantined.append({"line": line.number, "why": why, "raw": line.raw.decode("utf-8", "replace")})
                continue
            event = line.record
            if event["event"] == "close":
                events.pop(event["episode"], None)
            else:
                events.setdefault(event["episode"], []).append(event)
        if quarantined:
            quarantine = Journal(self.quarantine_path)
            for item in quarantined:
                quarantine.append({"file": str(self.wal_path), **item})
            quarantine.close()
        written = _episode_ids(self.episodes_path) | _episode_ids(self.unfinished_path)
        self.open = {e.session: e for e in episodes.values() if e.episode_id not in written}
        kept = [event for e in self.open.values() for event in events[e.episode_id]]
        atomic_write_text(self.wal_path, b"".join(encode_record(event) for event in kept).decode("utf-8"))
        if self.open:
            logging.info("recovered %d open episodes (%d turns) from %s", len(self.open),
                         sum(len(e.turns) for e in self.open.values()), self.wal_path)


def _is_retry(episode: OpenEpisode, task: str, history: list[dict[str, str]]) -> bool:
    """Whether the request asks the episode's last turn again: the conversation as it was before that turn (a client
    that timed out and retried, as the OpenAI SDKs do, or two identical requests one after the other)."""
    return bool(episode.turns) and _divergence(dataclasses.replace(episode, turns=episode.turns[:-1]), task,
                                               history) is None


def _divergence(episode: OpenEpisode, task: str, history: list[dict[str, str]]) -> str | None:
    """Why `history` does not continue `episode` (None when it does): the task, the number of completed turns, or
    the content of a served response or of recorded feedback (all but the last turn's, which this request brings;
    compared without surrounding whitespace, which clients may normalise)."""
    if episode.task.prompt != task:
        return "the request is of another task"
    if len(history) != episode.length:
        return f"the request has {len(history)} completed turns, the recorded episode {episode.length}"
    for i, turn in enumerate(episode.turns):
        given = history[episode.offset + i]
        if given["response"].strip() != turn.response.strip():
            return f"turn {episode.offset + i}'s response is not the one served"
        if i + 1 < len(episode.turns) and given["feedback"].strip() != turn.feedback.strip():
            return f"turn {episode.offset + i}'s feedback is not the one recorded"
    return None


def _repair(path: Path) -> None:
    """A torn last line of an output file cut off and kept beside it (module docstring)."""
    torn = repair_torn_tail(path)
    if torn:
        kept = path.with_name(path.name + ".torn")
        with open(kept, "ab") as f:
            f.write(torn + b"\n")
        logging.warning("%s ended in a torn line (%d bytes, a write cut short): cut off and kept in %s", path,
                        len(torn), kept)


def _check_turn(event: dict, task: Task, pool: ModelPool) -> None:
    """UnrecordableTurn unless the turn event, written and read back, is a turn the trajectory schema accepts."""
    try:
        encode_record(event)
        _read_turn(event["turn"], event["episode"], task, pool)
    except (DataError, ValueError, UnicodeEncodeError) as error:
        raise UnrecordableTurn(f"the served turn cannot be recorded: {error}") from None


def _read_turn(turn: dict, episode_id: str, task: Task, pool: ModelPool) -> Turn:
    """A turn event read through the schema's own reader (a lone turn is made terminal there; only closing does)."""
    return Episode.from_json({"episode_id": episode_id, "task": task.to_json(), "turns": [turn], "outcome": 0},
                             pool, path=WAL).turns[0]


def _apply(event: dict, episodes: dict[str, OpenEpisode], pool: ModelPool) -> None:
    """One write-ahead event applied to the episodes it builds (by episode id)."""
    kind, episode_id = event["event"], event["episode"]
    if kind == "open":
        task = Task(event["task"]["id"], event["task"]["prompt"], event["task"].get("family"))
        if not all(isinstance(x, str) for x in (task.id, task.prompt, event["session"])):
            raise ValueError("an episode's task id, prompt and session must be text")
        episodes[episode_id] = OpenEpisode(episode_id, event["session"], task, event["offset"], [], event["time"])
        return
    episode = episodes.get(episode_id)
    if episode is None:
        return
    if kind in ("turn", "replace"):
        turn = dataclasses.replace(_read_turn(event["turn"], episode_id, episode.task, pool), done=False)
        if kind == "replace":
            episode.turns[-1] = turn
        else:
            episode.turns.append(turn)
    elif kind == "feedback":
        if not isinstance(event["feedback"], str):
            raise ValueError(f"feedback must be text, got {type(event['feedback']).__name__}")
        episode.turns[event["index"]] = dataclasses.replace(episode.turns[event["index"]], feedback=event["feedback"])
    elif kind == "close":
        del episodes[episode_id]
        return
    episode.updated = event["time"]


def _episode_ids(path: Path) -> set[str]:
    """The episode ids written to one of the output files (a close may have been cut short after writing)."""
    return {line.record["episode_id"] for line in read_lines(path)
            if line.record is not None and isinstance(line.record.get("episode_id"), str)}
