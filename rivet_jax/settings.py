"""What every config key means, declared once, and the typed values the method reads instead of a ConfigDict.

Each key of the training config is declared here once (`SETTINGS`; the proxy's: `SERVE_SETTINGS`) with what it
means, its default, the check its value must pass and whether a resumed run may change it; configs/default.py and
configs/serve.py are built from these tables (`config_of`), the experiments' configs add their own sections:

    RUN       fixed for the life of a run: a resume, or a later stage starting from an earlier one's parameters,
              must see the same value (seed, the corpus settings, reward, model, loss, optimizer)
    TD        fixed from the TD stage on (the CQL term's weight and where it applies): the MC stage never reads
              them, so one MC warm start serves every setting of a conservatism grid (`train.mc_leaders`)
    EPOCHS    a stage's own epoch count: raised (or lowered, not below the epochs done) on a resume of that stage,
              fixed for the stages after it, which start from its finished parameters
    ONLINE    fixed while the online stage resumes itself (its schedule and its environment)
    FREE      anything else: devices, caches, checkpoint cadence, the experiments' evaluation and report settings

`config_checks` (the checks), `run_identity` (what a resume compares), `learner.shape_signature` (which keys the
runs of one group may differ in: `per_run`) and the launchers' `--help` (the meanings) all read this table. A key
not declared takes its section's kind (`SECTIONS`): a setting added to `loss` is RUN until declared otherwise.

The entry points (the engines, the online stage) read the ConfigDict once into the typed values below; the losses
and the learner take those plain values.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import ml_collections
from ml_collections import config_dict

from rivet_jax.data.cards import CARD_INPUTS, valid_card_inputs

RUN, TD, EPOCHS, ONLINE, FREE = "run", "td", "epochs", "online", "free"
STAGES = ("mc", "td", "online", "offline", "all")
CQL_ON = ("all", "stochastic")  # where Eq. 10 applies: every logged transition, or the stochastic choices only
# Weights of Eq. 1 and Eq. 11 far above this make every reward the cost term alone, or the CQL term alone: a run
# that trains to the end on numbers of 1e30 says nothing. Success is worth 1 and c_ref is a typical turn's cost.
MAX_WEIGHT = 1e3
# Fitted-Q evaluation on held-out logs (launch.evaluate_logs, launch.calibrate) reads the state embedding on its top
# FQE_FEATURES principal directions (`heldout.principal_features`): a refit costs about N D^2 + M D^3 and the bootstrap
# refits 200 times, so on the 49-model pool's test split the whole embedding (D = 1024) would take about 34 min. On
# RouteSim's logs 512 directions gave the whole embedding's FQE errors against the exact values, 256 larger ones
# (docs/offpolicy.md).
FQE_FEATURES = 512


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def within(low: float, high: float, low_open: bool = False) -> Callable[[Any], bool]:
    return lambda v: is_number(v) and (v > low if low_open else v >= low) and v <= high


def is_lambda_range(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and (len(value) == 0 or (
        len(value) == 2 and all(map(within(0.0, MAX_WEIGHT), value)) and value[0] <= value[1]))


def at_least(low: int) -> Callable[[Any], bool]:
    return lambda v: is_integer(v) and v >= low


def one_of(*choices) -> Callable[[Any], bool]:
    return lambda v: v in choices


def is_warm_start(value: Any) -> bool:
    return value == "" or parse_warm_start(value) is not None


def parse_warm_start(value: Any) -> tuple[str, str, int | None] | None:
    """'<run dir>:<stage>[@<epoch>]' -> (run dir, stage, epoch or None: the last); None when it is not that."""
    if not isinstance(value, str) or ":" not in value:
        return None
    run, _, at = value.rpartition(":")
    stage, _, epoch = at.partition("@")
    if not run or stage not in ("mc", "td", "online") or (epoch and not epoch.isdigit()):
        return None
    return run, stage, int(epoch) if epoch else None


def anything(value: Any) -> bool:
    return True


class Placeholder(NamedTuple):
    """A default of None that a `--config.KEY=VALUE` override may set to a value of `type` (ml_collections'
    placeholder)."""

    type: type


class Setting(NamedTuple):
    meaning: str
    check: Callable[[Any], bool] = anything
    expected: str = "any value"
    resume: str = FREE      # RUN, TD, EPOCHS, ONLINE or FREE (module docstring)
    per_run: bool = False   # the runs of one group may differ in it (values the group's program reads, bookkeeping)
    suspect: bool = False   # scales a loss or a step: named when a stage diverges at its first step
    default: Any = None     # the value of configs/default.py (configs/serve.py for SERVE_SETTINGS)


_INT1, _INT0 = (at_least(1), "an integer >= 1"), (at_least(0), "an integer >= 0")
_LR = (within(0.0, 1.0, low_open=True), "a learning rate in (0, 1]")
_PROBABILITY = (within(0.0, 1.0), "a probability in [0, 1]")
_FRACTION = (within(0.0, 0.9), "a fraction of the tasks in [0, 0.9]")
_SECONDS = (within(0.0, math.inf, low_open=True), "seconds > 0")

SETTINGS: dict[str, Setting] = {
    # the run
    "stage": Setting("the stages to train: mc, td, online, offline (mc then td) or all", one_of(*STAGES),
                     f"one of {', '.join(STAGES)}", per_run=True, default='offline'),
    # Fine-tuning a router that serves (launch.loop's warm candidates): the run's first stage starts from its
    # parameters instead of from initialisation (mc) or from the run's own MC stage (stage = td).
    "warm_start": Setting("a router checkpoint the run's first stage starts from: '<run dir>:<stage>' (its last "
                          "epoch) or '<run dir>:<stage>@<epoch>' ('' = initialisation)", is_warm_start,
                          "'' or '<run dir>:<mc|td|online>[@<epoch>]'", RUN, per_run=True, default=''),
    "seed": Setting("initialisation, shuffles and exploration draws", is_integer, "an integer", RUN, per_run=True,
                    default=42),
    "devices": Setting("devices to train on (0 = every visible device); runs split over them, then batches",
                       at_least(0), "an integer >= 0 (0 = every visible device)", default=1),
    # Runs trained together (engine.py: seeds, ablations, a lambda sweep) share one compiled program; on CPU a
    # single update is already compute-bound (27 vmapped runs measured 0.8x one run's steps/s on 2 cores).
    "runs_vmapped": Setting("runs of a group vmapped into each step (-1: all on GPU/TPU, one at a time on CPU; 0: all)",
                            at_least(-1), "an integer >= -1 (-1: by platform, 0: all)", per_run=True, default=-1),
    "max_state_tokens": Setting("the serialization budget of a state (App. B.3)", *_INT1, RUN, default=16384),
    # data
    "data.episodes": Setting("the trajectory JSONL to train on: a path, several separated by commas, or a glob "
                             "(compared by content on resume, not by path)", default=''),
    "data.cards": Setting("the pool's model_cards.json (compared by content on resume, not by path)", default=''),
    "data.skip_invalid": Setting("skip and count malformed records instead of stopping", resume=RUN, default=False),
    "data.max_skipped_fraction": Setting("skip mode fails when more of the records than this are bad",
                                         within(0.0, 1.0), "a fraction in [0, 1]", default=0.1),
    # Held out from training, by task (data/splits.py; written to <workdir>/splits.json and kept): validation
    # chooses (deploy.py), test reports (verdict.py, launch.evaluate_logs). 0 and 0: train on every task.
    "data.holdout.validation": Setting("share of the tasks held out to validate (whole tasks per family, at least one "
                                       "in a family of 3 or more)",
                                       *_FRACTION, RUN, default=0.1),
    "data.holdout.test": Setting("share of the tasks held out to test", *_FRACTION, RUN, default=0.1),
    "data.holdout.seed": Setting("the draw of the held-out tasks", is_integer, "an integer", RUN, default=0),
    "data.holdout.extend": Setting("an earlier workdir's splits.json: its tasks keep their split, new ones are "
                                   "drawn by their hash ('' = a fresh split)", resume=RUN, default=''),
    "data.embedding_cache": Setting("frozen-encoder cache directory ('' = <workdir>/embeddings)", per_run=True,
                                    default=''),
    # True: the table is a memory-mapped file (<embedding cache>/tables/) batches are gathered from on the host, so a
    # corpus larger than memory trains. Multi-host runs always feed batches from the host.
    "data.embeddings_on_disk": Setting("the embedding table memory-mapped, batches gathered on the host",
                                       default=False),
    "data.host_chunk_steps": Setting("host-fed training: batches gathered and run per jit call", *_INT1, default=32),
    # True (and no `episodes`): RouteSim's logging policies (6 fixed models + a random router) on `demo_tasks` of its
    # training tasks, collected into <workdir>/data/.
    "data.demo": Setting("train on RouteSim's demo corpus, collected into the workdir", resume=RUN, default=False),
    "data.demo_tasks": Setting("training tasks of the demo corpus", *_INT1, RUN, default=200),
    "data.demo_seed": Setting("the demo corpus' draws", resume=RUN, default=0),
    # encoder (compared by its fingerprint on resume)
    "encoder.name": Setting("the frozen text encoder: hashing, minilm, bert, qwen3 or wordllama", default='hashing'),
    "encoder.dim": Setting("the encoder's output width", *_INT1, default=1024),
    # reward (Eq. 1-2)
    "reward.lam": Setting("lambda, the cost weight of Eq. 1", within(0.0, MAX_WEIGHT),
                          f"a number in [0, {MAX_WEIGHT:g}] (the cost weight of Eq. 1)", RUN, per_run=True,
                          suspect=True, default=0.05),
    "reward.lam_range": Setting("lambda-conditioned training: each transition's lambda drawn from [low, high] "
                                "(denser near low) and read by the network, one run for every trade-off; () = the "
                                "fixed reward.lam", is_lambda_range,
                                f"() or (low, high) with 0 <= low <= high <= {MAX_WEIGHT:g}", RUN, default=()),
    "reward.gamma": Setting("the discount of Eq. 2", within(0.0, 1.0, low_open=True), "a discount in (0, 1]", RUN,
                            suspect=True, default=0.99),
    "reward.c_ref": Setting("the cost unit of Eq. 1 (None: the training corpus' mean per-turn cost)",
                            lambda v: v is None or (is_number(v) and v > 0), "None (from the corpus) or a cost > 0",
                            RUN, default=Placeholder(float)),
    # model (Sec. 4.1)
    "model.hidden": Setting("width of the shared state-model representation z(s, m)", *_INT1, RUN, default=128),
    "model.card_dim": Setting("width of the card projection z_m (Eq. 22)", *_INT1, RUN, default=128),
    "model.head_hidden": Setting("hidden width of the RVE and RIVE heads", *_INT1, RUN, default=64),
    "model.response_dim": Setting("width of RIVE's response projection", *_INT1, RUN, default=64),
    "model.card_inputs": Setting("the card inputs the projector reads (the others enter as zeros)", valid_card_inputs,
                                 "distinct groups among " + ", ".join(CARD_INPUTS), RUN,
                                 default=('description', 'context', 'prices', 'flags')),
    # True: each candidate's prompt-cache saving, known before the call (the previous turn's model and prompt, the
    # cards' cached prices), is added to Q_route as lambda x saving, and the network learns the rest
    # (rivet_jax/data/prompt_cache.py); False: cache-blind, as before
    "model.cache_aware": Setting("add what each candidate's prompt cache saves, known before the call, to Q_route",
                                 resume=RUN, default=False),
    # loss (Eqs. 7-11)
    "loss.beta": Setting("RIVE's weight in Eq. 7; 0 = w/o RIVE", within(0.0, MAX_WEIGHT),
                         f"a number in [0, {MAX_WEIGHT:g}] (the RIVE weight of Eq. 7)", RUN, per_run=True,
                         suspect=True, default=1.0),
    "loss.alpha": Setting("CQL's weight in Eq. 11; 0 = w/o CQL", within(0.0, MAX_WEIGHT),
                          f"a number in [0, {MAX_WEIGHT:g}] (the CQL weight of Eq. 11)", TD, per_run=True,
                          suspect=True, default=0.1),
    "loss.huber_delta": Setting("the Huber loss' delta", within(0.0, math.inf, low_open=True), "a number > 0", RUN,
                                default=1.0),
    "loss.zero_response": Setting("w/o response: RIVE reads a zero vector instead of e(o_t)", resume=RUN,
                                  per_run=True, default=False),
    "loss.cql_on": Setting("where Eq. 10 applies: every transition, or where the logged choice was a draw",
                           one_of(*CQL_ON), "'all' or 'stochastic'", TD, per_run=True, default='all'),
    # optimizer (App. B.2)
    "optim.lr": Setting("AdamW's learning rate (offline stages)", *_LR, RUN, suspect=True, default=0.0003),
    "optim.weight_decay": Setting("AdamW's weight decay", within(0.0, math.inf), "a number >= 0", RUN, default=0.01),
    "optim.clip_norm": Setting("global-norm gradient clipping", within(0.0, math.inf, low_open=True), "a number > 0",
                               RUN, suspect=True, default=5.0),
    "optim.batch_size": Setting("transitions per update", *_INT1, RUN, default=64),
    # the schedule and checkpoints
    "target_sync_steps": Setting("updates between copies of the online network to the target network", *_INT1, RUN,
                                 default=200),
    "mc_epochs": Setting("epochs of the Monte Carlo warm start", *_INT0, EPOCHS, default=5),
    "td_epochs": Setting("epochs of Double DQN + CQL", *_INT0, EPOCHS, default=20),
    "checkpoint_every_epochs": Setting("epochs between checkpoints", *_INT1, default=1),
    "checkpoints_to_keep": Setting("checkpoints kept per stage", lambda v: v is None or at_least(1)(v),
                                   "None (keep all) or an integer >= 1", default=2),
    # online adaptation (App. B.2)
    # Online adaptation (stage 'online', App. B.2), in the environment of `config.sim`.
    "online.lr": Setting("AdamW's learning rate of the online stage", *_LR, ONLINE, suspect=True, default=3e-05),
    "online.epsilon_start": Setting("exploration at the first trajectory", *_PROBABILITY, ONLINE, default=0.1),
    "online.epsilon_end": Setting("exploration after the anneal", *_PROBABILITY, ONLINE, default=0.02),
    "online.epsilon_episodes": Setting("trajectories of the linear epsilon anneal", *_INT1, ONLINE, default=140),
    "online.validate_every": Setting("trajectories between validations", *_INT1, ONLINE, default=35),
    "online.early_stop_after": Setting("no early stop before this many trajectories", *_INT0, ONLINE, default=140),
    "online.patience": Setting("validations without improvement before stopping", *_INT1, ONLINE, default=2),
    "online.max_passes": Setting("passes over the task pool at most", *_INT1, ONLINE, default=3),
    # The best validation is the online checkpoint kept, the TD router included: with 1 rollout of RouteSim's 35
    # validation tasks J has sd ~0.06, more than the adaptation moves it, so the "best" was the luckiest draw (alpha-0
    # runs kept one that validated 0.745 on fresh rollouts against 0.765 for their TD router); with 8 (sd ~0.02) the
    # kept router validates 0.768.
    "online.eval_rollouts": Setting("rollouts per task of every validation and curve point", *_INT1, ONLINE, default=8),
    "online.split": Setting("the tasks the online stage adapts on", resume=ONLINE, default='train'),
    "online.validation_split": Setting("the tasks every validation rolls out on", resume=ONLINE, default='validation'),
    "online.test_split": Setting("the tasks of the learning curve", resume=ONLINE, default='test'),
    "online.eval_seed": Setting("the draws of every validation and curve point", resume=ONLINE, default=0),
    "online.curve_points": Setting("trajectories after which the test learning curve is drawn (Figure 4)",
                                   resume=ONLINE, per_run=True, default=(0, 35, 70, 105, 140)),
    "online.defer_curve": Setting("keep the router at each curve point (stage 'online_curve') and draw the curve later "
                                  "(online.draw_curves), only for the runs whose curve is read", one_of(True, False),
                                  "True or False", ONLINE, per_run=True, default=False),
    # launch.calibrate (calibrate.py): a router per lambda, each one's success and cost per episode on validation, the
    # most successful within a budget per episode.
    "calibrate.lambdas": Setting("the lambdas a router is trained at", lambda v: isinstance(v, (tuple, list))
                                 and len(v) > 0 and all(within(0.0, MAX_WEIGHT)(x) for x in v),
                                 f"a non-empty list of lambdas in [0, {MAX_WEIGHT:g}]",
                                 default=(0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)),
    "calibrate.stage": Setting("the stages each lambda's router trains", one_of(*STAGES),
                               f"one of {', '.join(STAGES)}", default='offline'),
    "calibrate.one_run": Setting("train one lambda-conditioned run for every lambda (reward.lam_range over them; "
                                 "offline stages only) instead of a run per lambda", one_of(True, False),
                                 "true or false", default=True),
    "calibrate.rollouts": Setting("RouteSim: rollouts per validation task", *_INT1, default=8),
    "calibrate.split": Setting("RouteSim: the tasks rolled out on (own logs: the held-out validation split)",
                               default='validation'),
    "calibrate.resamples": Setting("bootstrap resamples of every 95% interval", *_INT1, default=200),
    "calibrate.seed": Setting("the bootstrap's draws", default=3),
    "calibrate.max_features": Setting("own logs: FQE's principal directions of the state embedding (0: all of it)",
                                      *_INT0, default=FQE_FEATURES),
    # One round of learning from live traffic (loop.py, launch.loop): the recorded episodes it adds, and the share of
    # their new tasks held out to prove a candidate's gain over the served router.
    "loop.recorded": Setting("the episodes the proxy recorded ('' = <workdir>/serve/episodes.jsonl)", default=''),
    # Half of the held-out tasks choose the candidate, the other half prove its gain: each needs enough traffic.
    # Warm candidates: each run of the served router trained on from its parameters (`warm_start`), TD at the online
    # stage's small step, on the logs and everything recorded: fine-tuned routers differ from the served one at few
    # states, so their paired gain over it is estimated far more tightly than a router trained from scratch.
    "loop.warm_epochs": Setting("TD epochs of the warm candidates (0: none; their checkpoints at multiples of "
                                "deploy.keep_td_every are candidates too)", *_INT0, default=10),
    "loop.warm_lr": Setting("the warm candidates' learning rate", *_LR, default=3e-05),
    "loop.holdout": Setting("share of the recorded traffic's new tasks held out to choose a candidate and prove its "
                            "gain over the served router", within(0.05, 0.9), "a fraction in [0.05, 0.9]",
                            default=0.5),
    # The validated choice that ends training (pipeline.py, deploy.py): runs at each conservatism setting (CQL weight
    # x where it applies; the config's own loss is always one), each stage's checkpoint, their ensemble, each
    # recentred with shrinkage k; the best fixed model (k = 0) is always a candidate.
    "deploy.enabled": Setting("end training by choosing what to deploy on the validation tasks", one_of(True, False),
                              "True or False", default=True),
    "deploy.alphas": Setting("the CQL weights of the conservatism grid", lambda v: isinstance(v, (tuple, list))
                             and all(within(0.0, MAX_WEIGHT)(x) for x in v),
                             f"a list of CQL weights in [0, {MAX_WEIGHT:g}]", default=(0.0, 0.01, 0.1)),
    "deploy.cql_on": Setting("where CQL applies, in the conservatism grid", lambda v: isinstance(v, (tuple, list))
                             and all(x in CQL_ON for x in v), f"a list of {' / '.join(CQL_ON)}",
                             default=('stochastic', 'all')),
    "deploy.seeds": Setting("runs per conservatism setting, each from its own seed (initialisation and shuffles); a "
                            "setting's candidates average their Q_route", *_INT1, default=1),
    "deploy.shrinkage": Setting("the shrinkage k > 0 of the recentred candidates (k = 0, the best fixed model, is "
                                "always one)", lambda v: isinstance(v, (tuple, list))
                                and all(within(0.0, 1.0)(x) for x in v), "a list of numbers in [0, 1]",
                                default=(1.0, 0.5, 0.25)),
    "deploy.by_family": Setting("candidates recentred on the floors of each task family too (the best fixed model per "
                                "family, k = 0, among them), where the training tasks have two families with "
                                "fixed-model returns", one_of(True, False), "True or False", default=True),
    "deploy.keep_td_every": Setting("TD checkpoints at multiples of this many epochs are kept as candidates (0: the "
                                    "last only)", *_INT0, default=5),
    "deploy.require_gain": Setting("deploy a router only if it beats the best fixed model with a paired 95% "
                                   "interval above 0", one_of(True, False), "True or False", default=True),
    "deploy.simultaneous": Setting("the gain bar holds for every candidate at once (the studentized max-statistic "
                                   "bootstrap): the more candidates compared, the higher it is", one_of(True, False),
                                   "True or False", default=False),
    "deploy.one_se": Setting("deploy the earliest listed (simplest) candidate whose validation J is within one "
                             "standard error of the best's (paired), among those that clear the gain bar",
                             one_of(True, False), "True or False", default=False),
    # Cross-validation over tasks: a validation split of a tenth of the tasks (20 on RouteSim's logs) leaves every
    # interval too wide to show a gain; folds estimate every candidate on every training task, each by runs that
    # never trained on it, at the price of K more trainings of the grid (pipeline.py).
    "deploy.folds": Setting("cross-validate the choice over this many folds of the tasks (config.data.holdout."
                            "validation is then not held out; 1: choose on the validation split)", *_INT1, default=1),
    "deploy.resamples": Setting("bootstrap resamples of every interval", *_INT1, default=200),
    "deploy.rollouts": Setting("with an environment: rollouts per validation and test task", *_INT1, default=8),
    "deploy.seed": Setting("the bootstrap's and the rollouts' draws", default=0),
    # Doubly robust estimates on logs with exact propensities (the exploring proxy's, launch.loop): an episode's
    # cumulative importance weight above this switches to the fitted model from that turn on (ope.switched). 10:
    # chosen on the first round of the RouteSim live experiment's traffic tasks (train and validation, never test),
    # where 5 and 10 ranked the 121 candidates alike and unbounded weights put a candidate at J 1.15 (exact 0.69).
    "deploy.max_weight": Setting("the largest cumulative importance weight the doubly robust estimates use before "
                                 "switching to the fitted model", within(1.0, math.inf), "a number >= 1",
                                 default=10.0),
}

# launch.serve's config (configs/serve.py is built from this table).
SERVE_SETTINGS: dict[str, Setting] = {
    "host": Setting("the interface the proxy listens on (beyond loopback, set auth_token_env)", default="127.0.0.1"),
    "port": Setting("the proxy's TCP port", lambda v: is_integer(v) and 0 <= v <= 65535, "a TCP port in [0, 65535]",
                    default=8000),
    "router_stage": Setting("the checkpoint stage to serve ('' = the deployed choice, else the last trained)",
                            one_of("", "mc", "td", "online"), "'' (the deployed choice), 'mc', 'td' or 'online'",
                            default=""),
    "logdir": Setting("where the served turns are recorded ('' = <workdir>/serve)", default=""),
    "model_id": Setting("the model name GET /v1/models lists (a request's `model` is not read)", default="rivet"),
    "session_header": Setting("the request header naming an episode's session", default="x-rivet-session"),
    "task_family": Setting("recorded episodes' task family, unless a request's x-rivet-task-family says",
                           default=""),
    "lam": Setting("the cost weight (Eq. 1's lambda) requests route for unless their x-rivet-lambda header says "
                   "(None: the router's own reward.lam; only a lambda-conditioned router takes another)",
                   lambda v: v is None or within(0.0, MAX_WEIGHT)(v), f"None or a number in [0, {MAX_WEIGHT:g}]",
                   default=Placeholder(float)),
    "exploration": Setting("how the proxy explores: epsilon (uniform), softmax (over Q_route) or margin (uniform "
                           "among the candidates within `margin` of the best)", one_of("epsilon", "softmax", "margin"),
                           "'epsilon', 'softmax' or 'margin'", default="epsilon"),
    "epsilon": Setting("per-turn exploration: the probability moved off the greedy candidate (epsilon, margin)",
                       *_PROBABILITY, default=0.0),
    "temperature": Setting("softmax exploration's temperature, in Q_route's units (the reward's)",
                           within(0.0, math.inf, low_open=True), "a number > 0", default=0.05),
    "margin": Setting("margin exploration: how far below the best Q_route a candidate may be and still be tried",
                      within(0.0, math.inf), "a number >= 0", default=0.05),
    "exploration_budget": Setting("expected Q_route given up by exploring, per episode, before the proxy serves "
                                  "greedily (0: no limit)", within(0.0, math.inf), "a number >= 0", default=0.0),
    "reload_every_s": Setting("how often the proxy checks the workdir's deploy.json for a new router (0: only on "
                              "POST /v1/admin/reload)", within(0.0, math.inf), "seconds >= 0", default=2.0),
    "seed": Setting("the exploration draws", is_integer, "an integer", default=0),
    # "auto": on the event loop for the hashing encoder, whose ~1 ms holds the GIL anyway; in a thread for the
    # neural encoders, so that their tens of ms do not stall other requests.
    "scoring": Setting("where the proxy scores: auto, inline (the event loop) or thread", one_of("auto", "inline",
                       "thread"), "'auto', 'inline' or 'thread'", default="auto"),
    "max_attempts": Setting("candidates tried per request before answering 502", *_INT1, default=3),
    "timeout_s": Setting("an upstream call's read timeout (a hang is a fault)", *_SECONDS, default=120.0),
    "connect_timeout_s": Setting("an upstream call's connect timeout", *_SECONDS, default=5.0),
    "deadline_s": Setting("an upstream call's total deadline, streamed or not (a reply trickled byte by byte or "
                          "kept alive by comments is a fault past it)", *_SECONDS, default=600.0),
    "cooloff_s": Setting("a faulted backend is not a candidate for this long", within(0.0, math.inf),
                         "seconds >= 0", default=30.0),
    "episode_timeout_s": Setting("an idle open episode closes after this long, outcome unknown (kept apart)",
                                 *_SECONDS, default=3600.0),
    # pool model -> {base_url, model, api_key_env} (configs/serve.py's docstring); a plain dict, since model names
    # hold dots that a nested config's keys cannot.
    "backends": Setting("each pool model's endpoint: {name: {base_url, model, api_key_env}}",
                        default=Placeholder(object)),
    # Bound beyond loopback, the proxy spends the upstream keys of whoever reaches it (rivet_jax/serve/app.py).
    "auth_token_env": Setting("the variable holding the token chat, outcome and model requests must carry as "
                              "'Authorization: Bearer <token>' ('' = none asked: loopback use)", default=""),
    "allowed_origins": Setting("browser origins whose cross-site requests are served, e.g. "
                               "('https://my-app.example',)", default=()),
    "max_body_bytes": Setting("a request body over this is answered 413", *_INT1, default=8 << 20),
}


def config_of(table: dict[str, Setting]) -> ml_collections.ConfigDict:
    """A config of every key of `table` at its default: the one place a key is declared, with its meaning."""
    config = ml_collections.ConfigDict()
    for key, setting in table.items():
        *sections, name = key.split(".")
        node = config
        for section in sections:
            if section not in node:
                node[section] = ml_collections.ConfigDict()
            node = node[section]
        default = setting.default
        node[name] = (config_dict.placeholder(default.type) if isinstance(default, Placeholder) else default)
    return config


def meaning(key: str) -> str | None:
    """What a key of the training or the serve config means (launchers' --help)."""
    setting = SETTINGS.get(key) or SERVE_SETTINGS.get(key)
    return None if setting is None else setting.meaning

# The kind of a key this table does not declare, by its section.
SECTIONS = {"data": RUN, "reward": RUN, "model": RUN, "loss": RUN, "optim": RUN, "online": ONLINE, "sim": ONLINE}


def resume_kind(key: str) -> str:
    """RUN, TD, EPOCHS, ONLINE or FREE for a dotted key: declared, else its section's kind."""
    setting = SETTINGS.get(key)
    return setting.resume if setting is not None else SECTIONS.get(key.split(".")[0], FREE)


def with_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]) -> ml_collections.ConfigDict:
    """A copy of `config` (a launcher's is locked) with dotted keys set: {"loss.beta": 0.0, "reward.lam": 0.1}."""
    config = ml_collections.ConfigDict(config.to_dict())
    config.update_from_flattened_dict(overrides)
    return config


PER_RUN = frozenset(key for key, setting in SETTINGS.items() if setting.per_run)
SUSPECTS = tuple(key for key, setting in SETTINGS.items() if setting.suspect)


# ------------------------------------------------------------------------------------------------- typed values


class LossWeights(NamedTuple):
    """The weights of Eq. 7 and 11 that a run may change without changing a shape: Python floats for one run, or
    traced scalars when many runs train as one program (`rivet_jax.engine`)."""

    alpha: Any     # CQL weight; 0 = "w/o CQL"
    beta: Any      # RIVE weight; 0 = "w/o RIVE"
    response: Any  # 1 = RIVE reads e(o_t); 0 = "w/o response" (a zero vector)
    cql_stochastic_only: Any = 0.0  # 1 = CQL only where the logged choice was stochastic (`loss.cql_on`)

    @classmethod
    def of(cls, config) -> "LossWeights":
        cql_on = config.loss.get("cql_on", "all")
        if cql_on not in CQL_ON:
            raise ValueError(f"config.loss.cql_on must be one of {CQL_ON}, got {cql_on!r}")
        return cls(alpha=config.loss.alpha, beta=config.loss.beta, response=0.0 if config.loss.zero_response else 1.0,
                   cql_stochastic_only=float(cql_on == "stochastic"))


class UpdateRule(NamedTuple):
    """What one gradient update reads besides the batch and the state: the values every run of a group shares."""

    gamma: float        # the discount of the TD target (Eqs. 8-9)
    huber_delta: float  # Eq. 7's Huber delta
    sync_steps: int     # updates between target-network copies
    lam_range: tuple = ()  # (low, high): every transition's lambda drawn from it (`reward.lam_range`)

    @classmethod
    def of(cls, config) -> "UpdateRule":
        return cls(gamma=float(config.reward.gamma), huber_delta=float(config.loss.huber_delta),
                   sync_steps=int(config.target_sync_steps),
                   lam_range=tuple(float(x) for x in config.reward.get("lam_range", ())))


class Optim(NamedTuple):
    """AdamW with global-norm clipping (App. B.2)."""

    lr: float
    weight_decay: float
    clip_norm: float

    @classmethod
    def of(cls, config, learning_rate: float | None = None) -> "Optim":
        """`config.optim`'s, at `learning_rate` if given (the online stage's `online.lr`)."""
        return cls(lr=float(config.optim.lr if learning_rate is None else learning_rate),
                   weight_decay=float(config.optim.weight_decay), clip_norm=float(config.optim.clip_norm))
