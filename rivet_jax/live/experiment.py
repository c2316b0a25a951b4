"""The live experiment (`launch.loop --config=configs/routesim_live.py`): from a cold start, rounds of
serve -> record -> learn -> promote, with RouteSim as the agent over real HTTP and its exact values beside every
decision the loop makes (reported, never used to decide).

  cold start  RouteSim's logged corpus (six fixed models and a random router on its training tasks) trained as
              one's own logs (`rivet_jax.fit`, the config's settings, no simulator): W/deploy.json
  a round     the proxy (`launch.serve`'s app, in this process) serves W's deployed router to `live.episodes`
              RouteSim episodes on tasks drawn from the train and validation splits, exploring as `live.exploration`
              says; `rivet_jax.loop.learn` retrains on the logs and all recorded traffic and decides; the round goes
              on record with its exact values and, promoted, W/deploy.json changes and the proxy swaps it in

Exact values (RouteSim rollouts of the router as the proxy serves it, `live.routesim.ServedPolicy`, at the served
router's reward; `live.exact_rollouts` per task, the same draws for every policy):

  exact_test_regret   the oracle's J on the test split minus the served router's, after the round
  exploration_cost    the served router's J greedy minus exploring (under the round's `exploration_budget`, the
                      episodes one after another as the proxy serves them), on the traffic's tasks (train +
                      validation); the budget is `live.fixed_budget` while a fixed model is served, else
                      `live.budget` (`round_budget`)
  ope.exact           the candidate's J on the tasks its gain was proved on (what its estimate estimates)
  promoted_change     the new router's exact test J minus the one it replaced (promoted rounds)
  best_candidate      (`live.exact_every_candidate`) the round's candidate with the best exact J on those tasks,
                      and how far the round's own candidate falls short of it; every row of `candidates` (estimated on
                      the choosing half) gains its `exact` J on the proving half's tasks: how well the choice ranks

After the last round (`live.own_logs_check`), the own-logs path on the recorded traffic alone (W/recorded.jsonl):
what it deploys and its exact test regret (W/own_logs.json).

Files: W/rounds.jsonl (`rivet_jax.loop`, with the exact values added), W/recorded.jsonl (every recorded episode)
and W/model_cards.json, W/live_report.md; `Router.from_checkpoint(W)` is the router served after the last round.

Resumable: the cold start resumes as training does; a round's episodes already recorded are not played again; a
round on record is not run again. W/live_report.md is the report.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import time
from pathlib import Path
from typing import Sequence

import httpx
import ml_collections
import numpy as np
from absl import logging

from rivet_jax import loop, pipeline, runs, settings
from rivet_jax.data.files import atomic_write_text
from rivet_jax.data.replay import Reward
from rivet_jax.data.schema import read_episodes, read_model_cards, write_episodes, write_model_cards
from rivet_jax.data.validation import DataError
from rivet_jax.deployment_file import DEPLOY_FILE
from rivet_jax.envs import oracle
from rivet_jax.envs.base import Policy, run_episodes
from rivet_jax.envs.routesim import RouteSim, make_routesim
from rivet_jax.evaluation import discounted_return
from rivet_jax.live.routesim import LiveEpisodes, ServedPolicy, play, upstream_app
from rivet_jax.router import Router
from rivet_jax.serve.app import make_app
from rivet_jax.serve.fake import ServerThread
from rivet_jax.serve.policy import Budget, Exploration
from rivet_jax.serve.proxy import Proxy
from rivet_jax.serve.recorder import Recorder
from rivet_jax.serve.upstream import Backend
from rivet_jax.settings import with_overrides

REPORT = "live_report.md"
RECORDED, CARDS = "recorded.jsonl", "model_cards.json"
OWN_LOGS_CHECK = "own_logs.json"
TRAFFIC_SPLITS = ("train", "validation")
# The packages whose versions move the experiment's numbers: one commit gave test regret 0.084 under one set and
# 0.091 under another (docs/live.md, live11 and live12); within one environment a rerun is the same to the digit.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")

__all__ = ["run", "cold_start", "exact_value", "environment", "REPORT"]


def run(config: ml_collections.ConfigDict, workdir: str | Path) -> list[dict]:
    """The whole experiment (module docstring); returns the rounds on record."""
    workdir = Path(workdir)
    live = config.live
    sim = make_routesim(live.sim)
    training = cold_start(config, workdir)
    router = Router.from_checkpoint(workdir)   # the deployed router: its reward is every exact value's
    reward = router.reward
    oracle_test = oracle.policy_report(sim, "test", reward, oracle_only=True)["oracle"]["return"]
    pool = read_model_cards(training.data.cards)
    episodes = LiveEpisodes(sim)
    with ServerThread(upstream_app(episodes)) as upstream:
        backends = {name: Backend(name, upstream.url + "/v1", name, "") for name in pool.names}
        serve_config = serve_settings(live)
        exploration = Exploration.of(serve_config)   # the proxy's own reading, for the exact exploration cost
        proxy = Proxy(router, backends, Recorder(workdir / "serve", pool), serve_config,
                      workdir=workdir)
        with ServerThread(make_app(proxy)) as server:
            loop.settle(workdir)
            httpx.post(server.url + "/v1/admin/reload", timeout=None)   # a reload loads and compiles: as long as it takes
            for number in range(len(loop.rounds_of(workdir)) + 1, int(live.rounds) + 1):
                served = proxy.served.current[0]
                budget = round_budget(live, served)
                proxy.budget = Budget(exploration, budget)   # the round's own (a resumed round: spent anew)
                started = time.perf_counter()
                played = play_round(server.url, episodes, workdir, number, live)
                logging.info("round %d: %d episodes played through the proxy (%.0fs), exploring under a budget of "
                             "%s per episode", number, played, time.perf_counter() - started, budget)
                result = loop.learn(without_live(training), workdir)
                result.record.update(exact_fields(sim, result, served, exploration, budget, reward, oracle_test,
                                                  live), environment=environment())
                loop.finish(workdir, result)
                publish_recorded(workdir, pool)
                swapped = httpx.post(server.url + "/v1/admin/reload", timeout=None).json()
                logging.info("round %d: %s; serving %s", number, result.record["why"], swapped["version"])
                write_report(workdir, oracle_test)
    if live.own_logs_check:
        own_logs_check(config, workdir, sim, reward, oracle_test)
    write_report(workdir, oracle_test)
    return loop.rounds_of(workdir)


def environment() -> dict[str, str]:
    """This process's Python and `PACKAGES` versions, as each round records them (the report names them)."""
    return {"python": platform.python_version(), **{name: importlib.metadata.version(name) for name in PACKAGES}}


def own_logs_check(config: ml_collections.ConfigDict, workdir: Path, sim: RouteSim, reward: Reward,
                   oracle_test: float) -> dict:
    """The own-logs path (`rivet_jax.fit`, the config's settings, no simulator) on the recorded traffic alone
    (W/recorded.jsonl, W/model_cards.json) in W/own_logs, and the exact test regret of what it deploys, as the
    proxy would serve it: W/own_logs.json (once)."""
    path = workdir / OWN_LOGS_CHECK
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    plain = without_live(with_overrides(config, {"data.episodes": str(workdir / RECORDED),
                                                 "data.cards": str(workdir / CARDS)}))
    logging.info("the own-logs path on the recorded traffic alone, into %s", workdir / "own_logs")
    recorded = sum(r["episodes"] for r in loop.rounds_of(workdir))
    try:
        result = pipeline.fit(plain, workdir / "own_logs")
    except DataError as error:   # e.g. no committed episode to estimate the best fixed model from
        check = {"refused": str(error), "recorded_episodes": recorded}
        atomic_write_text(path, json.dumps(check, indent=1) + "\n")
        return check
    router = Router.from_checkpoint(workdir / "own_logs")
    test = [t.id for t in sim.tasks("test")]
    value = exact_value(sim, ServedPolicy(router), test, int(config.live.exact_rollouts), int(config.live.seed) + 1000,
                        reward)
    check = {"deployed": (result["deploy"] or {}).get("name"), "exact_test_regret": oracle_test - value,
             "recorded_episodes": recorded}
    atomic_write_text(path, json.dumps(check, indent=1) + "\n")
    return check


def serve_settings(live: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The proxy's config for the experiment: the serve defaults with the live section's exploration (its budget is
    each round's own, set by `run`: `round_budget`)."""
    config = settings.config_of(settings.SERVE_SETTINGS)
    config.update(exploration=live.exploration, epsilon=float(live.epsilon), temperature=float(live.temperature),
                  margin=float(live.margin), seed=int(live.seed), reload_every_s=0.0, timeout_s=60.0)
    return config


def round_budget(live: ml_collections.ConfigDict, served: Router) -> float | None:
    """The exploration budget of a round serving `served` (None: none): `live.fixed_budget` while the floors alone
    decide (the cold start's best fixed model), else `live.budget`. A fixed model's scores are its floors, each a
    whole episode's value, so they charge an explored turn the whole gap between two fixed models: far more than a
    turn costs it (docs/live.md)."""
    budget = float(live.budget if served.choice.reads_q_route else live.fixed_budget)
    return None if budget == 0 else budget   # a negative one goes on to Budget, which says what it needs


def cold_start(config: ml_collections.ConfigDict, workdir: Path) -> ml_collections.ConfigDict:
    """RouteSim's logged corpus as one's own logs, trained through `rivet_jax.fit` without a simulator (once: a
    workdir with a deployment has its cold start); returns the training config the rounds reuse."""
    corpus = runs.collected_corpus(ml_collections.ConfigDict({"sim": config.live.sim.to_dict(),
                                                               "collect": config.live.collect.to_dict()}), workdir)
    episodes, cards = runs.corpus_files(corpus)
    training = with_overrides(config, {"data.episodes": str(episodes), "data.cards": str(cards)})
    if not (workdir / DEPLOY_FILE).exists():
        logging.info("cold start: training on RouteSim's logged corpus as one's own logs (no simulator)")
        pipeline.fit(without_live(training), workdir)
    return training


def without_live(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The training config alone (the simulator's section removed: the own-logs path never sees it)."""
    plain = ml_collections.ConfigDict(config.to_dict())
    del plain["live"]
    return plain


def play_round(url: str, episodes: LiveEpisodes, workdir: Path, number: int, live) -> int:
    """Round `number`'s episodes through the proxy, those already recorded (a resumed round) left out."""
    sim = episodes.sim
    tasks = [t.id for t in traffic_tasks(sim)]
    draws = np.random.default_rng([int(live.seed), number]).integers(len(tasks), size=int(live.episodes))
    sessions = [f"r{number}-{k}" for k in range(len(draws))]
    done = recorded_sessions(workdir / "serve")
    todo = [k for k, session in enumerate(sessions) if session not in done]
    play(url, episodes, [tasks[draws[k]] for k in todo], [(int(live.seed), number, k) for k in todo],
         [sessions[k] for k in todo])
    return len(todo)


def traffic_tasks(sim: RouteSim) -> list:
    """The tasks live traffic draws from: the train and validation splits (test is only for the exact report)."""
    return [t for split in TRAFFIC_SPLITS for t in sim.tasks(split)]


def recorded_sessions(logdir: Path) -> set[str]:
    """The sessions of the episodes a proxy closed (recorded or kept apart): episode ids are `<session>@<time>`."""
    out = set()
    for name in ("episodes.jsonl", "unfinished.jsonl"):
        path = logdir / name
        if path.exists():
            out |= {json.loads(line)["episode_id"].rsplit("@", 1)[0]
                    for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    return out


def exact_value(sim: RouteSim, policy: Policy, task_ids: Sequence[str], rollouts: int, seed: int,
                reward: Reward) -> float:
    """Mean J of `policy` over `task_ids` (repeats count), `rollouts` episodes each; episode (r, i) draws from
    rng([seed, r, i]) whatever the policy, so two policies are compared on the same draws."""
    ids = [task for _ in range(rollouts) for task in task_ids]
    rngs = [np.random.default_rng([seed, r, i]) for r in range(rollouts) for i in range(len(task_ids))]
    names = [f"{policy.name}/{k}" for k in range(len(ids))]
    if getattr(policy, "sequential", False):   # a budget's state runs on from episode to episode, as in the proxy
        episodes = [e for k in range(len(ids)) for e in run_episodes(sim, ids[k:k + 1], policy, rngs[k:k + 1],
                                                                     names[k:k + 1])]
    else:
        episodes = run_episodes(sim, ids, policy, rngs, names)
    return float(np.mean([discounted_return(e, reward) for e in episodes]))


def exact_fields(sim: RouteSim, result: loop.Round, served: Router, exploration: Exploration, budget: float | None,
                 reward: Reward, oracle_test: float, live) -> dict:
    """The round's exact values (module docstring); `budget` the round's (`round_budget`)."""
    rollouts, seed = int(live.exact_rollouts), int(live.seed) + 1000
    test = [t.id for t in sim.tasks("test")]
    traffic = [t.id for t in traffic_tasks(sim)]
    by_prompt = {t.prompt: t.id for t in traffic_tasks(sim)}
    held = [by_prompt[e.task.prompt] for e in result.held]
    before = exact_value(sim, ServedPolicy(served), test, rollouts, seed, reward)
    greedy = exact_value(sim, ServedPolicy(served), traffic, rollouts, seed, reward)
    exploring = exact_value(sim, ServedPolicy(served, exploration, seed=seed, budget=budget), traffic, rollouts, seed,
                            reward)
    candidate = exact_value(sim, ServedPolicy(result.router), held, rollouts, seed, reward)
    every = {name: exact_value(sim, ServedPolicy(router), held, int(live.candidate_rollouts), seed, reward)
             for name, router in result.routers().items()} if live.exact_every_candidate else {}
    promoted = result.record["promoted"]
    after = exact_value(sim, ServedPolicy(result.router), test, rollouts, seed, reward) if promoted else before
    ope = {**result.record["ope"], "exact": candidate,
           "covered": bool(result.record["ope"]["low"] <= candidate <= result.record["ope"]["high"])}
    best = max(every, key=every.get) if every else None
    name = result.record["candidate"]   # compared at the same rollouts as the others
    for row in result.record["candidates"] if every else []:   # every estimate beside its exact value
        row["exact"] = every[row["policy"]] if row["policy"] in every else None
    return {"best_candidate": None if best is None else {"name": best, "exact": every[best],
                                                           "shortfall_of_candidate": every[best] - every[name]},
            "exact_test_regret": oracle_test - after, "exact_test_regret_before": oracle_test - before,
            "promoted_change": after - before if promoted else 0.0, "exploration_cost": greedy - exploring,
            "exploration_budget": budget,
            "ope": ope}


def publish_recorded(workdir: Path, pool) -> None:
    """W/recorded.jsonl, every episode the proxy recorded so far (its W/serve/episodes.jsonl, checked through the
    schema), with the pool's W/model_cards.json beside it: what `launch.train` reads as one's own logs."""
    recorded = read_episodes(workdir / "serve" / "episodes.jsonl", pool).episodes
    write_episodes(workdir / RECORDED, recorded)
    write_model_cards(workdir / CARDS, pool)


def write_report(workdir: Path, oracle_test: float) -> None:
    rounds = loop.rounds_of(workdir)
    lines = ["# Learning from live traffic: RouteSim through the proxy", "",
             f"Exact values from RouteSim (reported, never used to decide); the oracle's test J {oracle_test:.4f}.",
             "Regret is the oracle's J minus the served router's on the test split; the estimate is the doubly "
             "robust J of the round's candidate on the held-out recorded episodes of the half of the tasks it "
             "was not chosen on, with its 95% interval, beside its exact J on the same tasks.", "",
             "| round | episodes | candidate | gain over served [95%] | estimate [95%] | exact | covered | promoted | "
             "test regret before -> after | exploration cost |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rounds:
        o = r["ope"]
        lines.append(f"| {r['round']} | {r['episodes']} | {r['candidate']} | {o['gain']:+.4f} [{o['gain_low']:+.4f}, "
                     f"{o['gain_high']:+.4f}] | {o['estimate']:.4f} [{o['low']:.4f}, {o['high']:.4f}] | "
                     f"{o['exact']:.4f} | {'yes' if o['covered'] else 'no'} | {'yes' if r['promoted'] else 'no'} | "
                     f"{r['exact_test_regret_before']:.4f} -> {r['exact_test_regret']:.4f} | "
                     f"{r['exploration_cost']:.4f} |")
    environments: dict[str, list[int]] = {}   # a resumed run may have changed environment between rounds
    for r in rounds:
        if "environment" in r:
            environments.setdefault(", ".join(f"{k} {v}" for k, v in r["environment"].items()), []).append(r["round"])
    if environments:
        lines += ["", *(f"Round{'s' * (len(numbers) > 1)} {', '.join(map(str, numbers))} ran under {names}."
                        for names, numbers in environments.items())]
    check = workdir / OWN_LOGS_CHECK
    if check.exists():
        own = json.loads(check.read_text(encoding="utf-8"))
        lines += ["", f"The own-logs path (`launch.train`, the config's settings) on the {own['recorded_episodes']} "
                      f"recorded episodes alone " + (f"refuses: {own['refused']}" if "refused" in own else
                                                     f"deploys {own['deployed']}: exact test regret "
                                                     f"{own['exact_test_regret']:.4f}.")]
    atomic_write_text(workdir / REPORT, "\n".join(lines) + "\n")
