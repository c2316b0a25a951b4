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

A turn's feedback is what the client sends after the model's response: the tool results and user messages that the
next request carries after that assistant message. It is filled in when that request arrives (a `feedback` event).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Callable

from absl import logging

from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.schema import Episode, ModelPool, Task, Turn
from rivet_jax.data.converters.openai_chat import prompt_task_id

__all__ = ["OpenEpisode", "Recorder", "NoOpenEpisodeError"]


class NoOpenEpisodeError(KeyError):
    """An outcome posted for a session with no open episode (HTTP 404)."""


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
        self.open: dict[str, OpenEpisode] = {}
        self._lock = threading.Lock()
        self._recover()
        self._wal = open(self.wal_path, "a", encoding="utf-8")

    def close_files(self) -> None:
        with self._lock:
            self._wal.close()

    # ------------------------------------------------------------------------------------------- per request

    def observe(self, session: str, task: str, history: list[dict[str, str]]) -> None:
        """A request of `session` arrived with `history` (one {"response", "feedback"} per completed turn): the last
        recorded turn gets its feedback; a conversation that does not continue the open episode closes it."""
        with self._lock:
            episode = self.open.get(session)
            if episode is None:
                return
            if episode.task.prompt != task or len(history) != episode.length:
                self._close(episode, None, f"diverged: the request has {len(history)} completed turns of "
                                           f"{'another' if episode.task.prompt != task else 'this'} task, the "
                                           f"recorded episode {episode.length}")
                return
            feedback = history[-1]["feedback"]
            if episode.turns and episode.turns[-1].feedback != feedback:
                episode.turns[-1] = dataclasses.replace(episode.turns[-1], feedback=feedback)
                self._log({"event": "feedback", "episode": episode.episode_id, "index": len(episode.turns) - 1,
                           "feedback": feedback})
            episode.updated = self.clock()

    def record(self, session: str, task: str, history_length: int, turn: Turn) -> tuple[str, int]:
        """Records a served turn (fsynced before returning): (episode id, the turn's index in the episode)."""
        with self._lock:
            episode = self.open.get(session)
            if episode is None:
                now = self.clock()
                episode = OpenEpisode(f"{session}@{now:.6f}", session, Task(prompt_task_id(task), task),
                                      history_length, [], now)
                self.open[session] = episode
                self._log({"event": "open", "episode": episode.episode_id, "session": session,
                           "task": episode.task.to_json(), "offset": history_length})
            episode.turns.append(turn)
            episode.updated = self.clock()
            self._log({"event": "turn", "episode": episode.episode_id, "turn": turn.to_json()})
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
        """Writes the episode to episodes.jsonl (an outcome and no reason) or unfinished.jsonl, then logs its close."""
        del self.open[episode.session]
        record = None
        if outcome is not None and reason is None:
            record = Episode(episode.episode_id, episode.task, tuple(episode.turns), outcome)
            _append_synced(self.episodes_path, record.to_json())
        else:
            _append_synced(self.unfinished_path, {
                "episode_id": episode.episode_id, "task": episode.task.to_json(),
                "turns": [turn.to_json() for turn in episode.turns], "outcome": outcome, "reason": reason})
            logging.info("episode %s kept apart: %s", episode.episode_id, reason)
        self._log({"event": "close", "episode": episode.episode_id})
        return record

    def _log(self, event: dict) -> None:
        event["time"] = self.clock()
        self._wal.write(json.dumps(event, ensure_ascii=False, allow_nan=False) + "\n")
        self._wal.flush()
        os.fsync(self._wal.fileno())

    def _recover(self) -> None:
        """Replays the write-ahead log into `open` and compacts it to the open episodes' events."""
        if not self.wal_path.exists():
            return
        episodes: dict[str, OpenEpisode] = {}
        events: dict[str, list[dict]] = {}
        for number, line in enumerate(self.wal_path.read_text(encoding="utf-8").splitlines(), start=1):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the last line, torn by a crash mid-write (nothing was answered on it)
                logging.warning("%s:%d: an unreadable event is skipped", self.wal_path, number)
                continue
            _apply(event, episodes, self.pool)
            if event["event"] == "close":
                events.pop(event["episode"], None)
            else:
                events.setdefault(event["episode"], []).append(event)
        written = _episode_ids(self.episodes_path) | _episode_ids(self.unfinished_path)
        self.open = {e.session: e for e in episodes.values() if e.episode_id not in written}
        kept = [event for e in self.open.values() for event in events[e.episode_id]]
        atomic_write_text(self.wal_path, "".join(json.dumps(event, ensure_ascii=False) + "\n" for event in kept))
        if self.open:
            logging.info("recovered %d open episodes (%d turns) from %s", len(self.open),
                         sum(len(e.turns) for e in self.open.values()), self.wal_path)


def _apply(event: dict, episodes: dict[str, OpenEpisode], pool: ModelPool) -> None:
    """One write-ahead event applied to the episodes it builds (by episode id)."""
    kind, episode_id = event["event"], event["episode"]
    if kind == "open":
        task = Task(event["task"]["id"], event["task"]["prompt"], event["task"].get("family"))
        episodes[episode_id] = OpenEpisode(episode_id, event["session"], task, event["offset"], [], event["time"])
        return
    episode = episodes.get(episode_id)
    if episode is None:
        return
    if kind == "turn":
        # Read back through the schema's own reader; a lone turn is made terminal there, which only closing decides.
        turn = Episode.from_json({"episode_id": episode_id, "task": episode.task.to_json(), "turns": [event["turn"]],
                                  "outcome": 0}, pool, path="<write-ahead log>").turns[0]
        episode.turns.append(dataclasses.replace(turn, done=False))
    elif kind == "feedback":
        episode.turns[event["index"]] = dataclasses.replace(episode.turns[event["index"]], feedback=event["feedback"])
    elif kind == "close":
        del episodes[episode_id]
        return
    episode.updated = event["time"]


def _episode_ids(path: Path) -> set[str]:
    """The episode ids written to one of the output files (a close may have been cut short after writing)."""
    if not path.exists():
        return set()
    ids = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ids.add(json.loads(line)["episode_id"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return ids


def _append_synced(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
