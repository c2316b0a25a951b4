"""Exact dynamic programming over RouteSim's hidden state: the optimal router, and exact policy statistics.

The hidden state before a turn is (t, k, w, c): turn index, current step, wrong proposals so far, prompt tokens.
From it, each model's next turn is a finite set of branches (outcome x wording) with known probabilities, token
counts and effects, all derived from the environment's own `render_response` and `respond`, so the DP and the
environment cannot disagree. Everything is computed backwards over t with c on an exact integer grid:

  V_t(k, w, c)  expected discounted return (Eq. 2)        -> the oracle's argmax over models
  S_t           probability of success                    -> accuracy
  $_t           expected remaining dollar cost             -> cost
  N_t           expected remaining turns
  Z_t(.., m)    probability of never switching away from m (given m was called last)  -> switch rate
  W_t           second moment of the return (behaviour policies only) -> Var(Y | X) for Proposition 4.1
  P_t, R_t      expected remaining prompt tokens, and those read from a prompt cache (with one) -> cached share

With a prompt cache (`sim.prompt_cache`) the state also holds who served the previous turn and how much the prompt
grew since (`CacheStates`): calling that model again reads the rest from its cache. The landing state after a turn
depends on the turn alone (its model and branch), so the tables gain that axis and each turn's arithmetic does not:
only the saving of the holder's column differs between cache states.

A policy is the weight it puts on each model at each hidden state: argmax of V (the oracle), one model (fixed), or
uniform (the random router), each restricted to the available models.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from rivet_jax.data.replay import Reward
from rivet_jax.envs.routesim import (OUTCOMES, SKILLS, VARIANTS, RouteSim, SimState, SimTask, render_response,
                                     respond)


@dataclasses.dataclass(frozen=True)
class Branches:
    """The B branches of every step of one task (B = outcomes x wordings). K steps, M models."""

    prob: np.ndarray     # (K, B, M) probability of the branch when model m acts at step k
    tokens: np.ndarray   # (K, B, M) prompt growth in token blocks: completion + the feedback's tokens
    cost_out: np.ndarray  # (B, M) output cost in dollars (price_out x completion tokens)
    advance: np.ndarray  # (K, B) int, 1 when the branch completes a non-final step
    wrong: np.ndarray    # (K, B) int, 1 when the branch is a wrong solution proposal
    correct: np.ndarray  # (K, B) float, 1 when the branch solves the task


def branches(sim: RouteSim, sim_task: SimTask) -> Branches:
    rng = np.random.default_rng(0)  # random content never changes token counts or effects (see render_response)
    kinds = [(o, v) for o, outcome in enumerate(OUTCOMES) for v in range(VARIANTS.get(outcome, 1))]
    num_steps = sim_task.num_steps
    prob = np.zeros((num_steps, len(kinds), len(sim.models)))
    tokens = np.zeros((num_steps, len(kinds), len(sim.models)), np.int64)
    advance, wrong = (np.zeros((num_steps, len(kinds)), np.int64) for _ in range(2))
    correct = np.zeros((num_steps, len(kinds)))
    for k in range(num_steps):
        probs = sim.outcome_probs(sim_task, k)  # (M, O)
        for b, (o, variant) in enumerate(kinds):
            text = render_response(OUTCOMES[o], SKILLS[sim_task.skills[k]], k, sim_task.answers[k],
                                   k == num_steps - 1, rng, variant)
            reply = respond(text, sim_task.answers, k, sim.max_proposals)
            prob[k, b] = probs[:, o] / VARIANTS.get(OUTCOMES[o], 1)
            tokens[k, b] = (sim.completion[:, o] + sim.feedback_tokens(reply.feedback)) // sim.block
            advance[k, b] = reply.progress and not reply.proposal
            wrong[k, b] = reply.proposal and not reply.correct
            correct[k, b] = reply.correct
    cost_out = np.stack([sim.price_out * sim.completion[:, o] for o, _ in kinds])  # (B, M)
    return Branches(prob, tokens, cost_out, advance, wrong, correct)


@dataclasses.dataclass(frozen=True)
class PolicyStats:
    """Exact expectations for one task from its first turn."""

    value: float          # expected discounted return J (Eq. 2)
    success: float        # probability of success
    cost: float           # expected dollar cost
    turns: float          # expected number of turns
    switch: float         # probability that the episode calls more than one model
    prompt_tokens: float | None = None  # expected prompt tokens, with a prompt cache ...
    cached_tokens: float | None = None  # ... and those of them read from it


@dataclasses.dataclass(frozen=True)
class CacheStates:
    """Whose prompt cache the next turn could read, and how much the prompt grew since: H states. State 0 is none
    (the first turn, a previous model that reads no cache, or no prompt cache at all: then the only state); every
    other state is (holder m, growth g): m served the previous turn, since when the prompt grew by g blocks, so m's
    cache holds the prompt less g. Only growths a branch of m can make are states."""

    holder: np.ndarray   # (H,) int, -1 for none
    growth: np.ndarray   # (H,) int, token blocks
    after: np.ndarray    # (K, B, M) int, the state after model m's turn at step k ended in branch b

    @classmethod
    def of(cls, tokens: np.ndarray, caches: np.ndarray) -> "CacheStates":
        """From a task's (K, B, M) prompt growth per branch (`Branches.tokens`) and which models read a cache."""
        holder, growth, after = [-1], [0], np.zeros(tokens.shape, np.int64)
        for m in np.flatnonzero(caches):
            growths = np.unique(tokens[:, :, m])
            after[:, :, m] = len(holder) + np.searchsorted(growths, tokens[:, :, m])
            holder += [int(m)] * len(growths)
            growth += growths.tolist()
        return cls(np.array(holder), np.array(growth), after)


@dataclasses.dataclass(frozen=True)
class Solution:
    stats: PolicyStats
    values: np.ndarray                # (T + 1, K, P, C, H) V_t(k, w, c, cache state) of the policy; V_T = 0
    second_moment: np.ndarray | None  # (T + 1, K, P, C, H) E[G_t^2], when asked for
    branches: Branches
    block: int                        # tokens per grid unit of c
    cache: CacheStates                # the cache states of `values`' last axis
    models: tuple[int, ...]           # the pool's models the DP ranged over (a fixed model's alone), in its order


def solve(sim: RouteSim, sim_task: SimTask, reward: Reward, policy: str | int,
          available: Sequence[bool] | None = None, second_moment: bool = False,
          task_branches: Branches | None = None) -> Solution:
    """Backward DP for one task. `policy`: 'oracle', 'random', or a model index (fixed model). `task_branches`:
    `branches(sim, sim_task)`, when the caller solves the task for several policies (they depend on the task only)."""
    lam, gamma, c_ref = reward
    full = br = branches(sim, sim_task) if task_branches is None else task_branches
    num_models = br.prob.shape[2]
    mask = np.ones(num_models, bool) if available is None else np.asarray(available, bool)
    models = tuple(range(num_models))
    if not isinstance(policy, str):
        # A fixed model only ever calls itself: the DP over its column alone is the same arithmetic, M times less.
        if not mask[policy]:
            raise ValueError(f"fixed model {policy} is not available")
        models = (policy,)
        br = dataclasses.replace(br, prob=br.prob[:, :, models], tokens=br.tokens[:, :, models],
                                 cost_out=br.cost_out[:, models])
        mask, policy = np.ones(1, bool), 0
    keep = list(models)
    # $ per prompt token past the cache (the input price without one) and read from it; which models read one
    price_write, price_read, caches = sim.price_write[keep], sim.price_read[keep], sim.caches[keep]
    num_steps, num_branches, num_models = br.prob.shape
    turns, proposals = sim.max_turns, sim.max_proposals
    cache = CacheStates.of(br.tokens, caches)
    holder = cache.holder[1:]                             # (H - 1,) the holders of the states that read a cache
    num_h = len(cache.holder)
    c0 = sim.task_tokens(sim_task) // sim.block          # prompt lengths in token blocks from here on
    pad = int(br.tokens.max())
    size = c0 + (turns - 1) * pad + 1                     # every reachable prompt length is < size
    ext = size + pad                                      # tables are padded so c + tokens never leaves them
    prompt = (np.arange(size) * sim.block).astype(float)  # (C,) prompt tokens
    cost_in = price_write[:, None] * prompt[None, :]      # (M, C) input dollars with nothing read from a cache
    # (H - 1, C) prompt tokens read from the cache when a state's holder is called again, and the dollars it saves
    read = np.maximum(np.arange(size)[None, :] - cache.growth[1:, None], 0) * sim.block
    saving = (price_write - price_read)[holder, None] * read
    # Quantities per state: V, S, $, N (+ W, the second moment) (+ P, R: prompt and cached tokens, with a cache)
    extra = ("W",) * second_moment + ("P", "R") * sim.prompt_cache
    names = ("V", "S", "$", "N", *extra)
    at_q = {name: i for i, name in enumerate(names)}
    num_q = len(names)
    # Where each (branch, model, c) lands: a row of the t+1 tables, flattened over (k, w, c, cache state), for every
    # (k, w) at once; a branch that ends the episode lands on the row past them (zeros, and Z = 1). These do not
    # depend on t, so the backward loop only gathers, and does each turn's arithmetic for all (k, w) together.
    k_index = np.arange(num_steps)[:, None, None]                                   # (K, 1, 1)
    wrong = np.arange(proposals)[None, :, None] + br.wrong[:, None, :]              # (K, W, B)
    cell = (k_index + br.advance[:, None, :]) * proposals + np.minimum(wrong, proposals - 1)   # (K, W, B) next (k, w)
    at = np.arange(size)[None, None, :] + br.tokens[..., None]                      # (K, B, M, C)
    done = (br.correct[:, None, :] > 0) | (wrong >= proposals)                      # (K, W, B)
    rows = num_steps * proposals * ext * num_h
    landing = np.where(done[..., None, None], rows,                                 # (K, W, B, M, C)
                       (cell[..., None, None] * ext + at[:, None]) * num_h + cache.after[:, None, :, :, None])
    landing_z = landing * num_models + np.arange(num_models)[:, None]               # (K, W, B, M, C)
    tables = (num_steps, proposals, ext, num_h)
    # What a turn adds before its future, summed over branches once: E[correct], E[1] (1 up to rounding) per model
    pay = br.prob                                                                   # (K, B, M)
    p_correct = np.einsum("kbm,kb->km", pay, br.correct)[:, None, :, None]          # (K, 1, M, 1)
    p_one = pay.sum(axis=1)[:, None, :, None]                                       # (K, 1, M, 1)
    nxt = np.zeros((rows + 1, num_q))                            # the quantities at t+1, then the zero row
    nxt_z = np.ones((rows + 1) * num_models)                     # Z at t+1 (no switch ever after the last turn)
    values = np.zeros((turns + 1, num_steps, proposals, size, num_h))
    moments = np.zeros((turns + 1, num_steps, proposals, size, num_h)) if second_moment else None
    grow_min = int(br.tokens.min())
    for t in reversed(range(turns)):
        # Only prompt lengths reachable at turn t: c0 + t * (least growth) .. c0 + t * (most growth).
        lo, hi = c0 + t * grow_min, c0 + t * pad + 1
        cur = np.zeros_like(nxt)
        cur_z = np.ones_like(nxt_z)
        cost = cost_in[None, :, lo:hi] + br.cost_out[:, :, None]                   # (B, M, C_t)
        p_cost = np.einsum("kbm,bmc->kmc", pay, cost)[:, None]                      # (K, 1, M, C_t)
        reward = -lam * cost[None] / c_ref + br.correct[:, :, None, None]           # (K, B, M, C_t)
        future = np.take(nxt, landing[..., lo:hi], axis=0)                          # (K, W, B, M, C_t, Q)
        expected = np.einsum("kbm,kwbmcq->qkwmc", pay, future)                      # (Q, K, W, M, C_t)
        # V summed as one expectation, not as E[r] + gamma E[V']: the oracle's argmax breaks exact ties (lambda 0
        # leaves many) by the model's index, and a rounding that differs between models would break them by noise.
        q = {"V": np.sum(pay[:, None, :, :, None] * (reward[:, None] + gamma * future[..., 0]), axis=2),
             "S": p_correct + expected[1],
             "$": p_cost + expected[2],
             "N": p_one + expected[3]}
        if second_moment:   # E[(r + gamma G')^2] = E[r^2] + 2 gamma E[r G'] + gamma^2 E[G'^2]
            q["W"] = (np.einsum("kbm,kbmc->kmc", pay, reward**2)[:, None]
                      + 2 * gamma * np.einsum("kbm,kbmc,kwbmc->kwmc", pay, reward, future[..., 0])
                      + gamma**2 * expected[at_q["W"]])
        if sim.prompt_cache:
            q["P"] = p_one * prompt[lo:hi] + expected[at_q["P"]]
            q["R"] = expected[at_q["R"]]
        stacked = np.stack([np.broadcast_to(q[name], expected.shape[1:]) for name in names])   # (Q, K, W, M, C_t)
        weights = _policy_weights(policy, q["V"], mask)                             # (K, W, M, C_t)
        z_next = np.einsum("kbm,kwbmc->kwmc", pay, np.take(nxt_z, landing_z[..., lo:hi]))     # (K, W, M, C_t)
        cur5, cur_z5 = cur[:rows].reshape(*tables, num_q), cur_z[:rows * num_models].reshape(*tables, num_models)
        # Cache state 0, none to read. Z(prev = m): switch-free from here only if the policy calls m again and then
        # never switches.
        none = np.einsum("kwmc,qkwmc->qkwc", weights, stacked)                      # (Q, K, W, C_t)
        cur5[:, :, lo:hi, 0] = np.moveaxis(none, 0, -1)
        cur_z5[:, :, lo:hi, 0] = np.moveaxis(weights * z_next, -2, -1)
        if len(holder):
            cur5[:, :, lo:hi, 1:], cur_z5[:, :, lo:hi, 1:] = _reading_states(
                policy, stacked, none, weights, z_next, mask, holder, saving[:, lo:hi], read[:, lo:hi], at_q,
                lam / c_ref)
        values[t] = cur5[:, :, :size, :, 0]
        if moments is not None:
            moments[t] = cur5[:, :, :size, :, at_q["W"]]
        nxt, nxt_z = cur, cur_z
    first = cur5[0, 0, c0, 0]
    # At the first turn there is no previous model: the episode never switches if, having called m, it keeps m.
    switch = max(0.0, 1.0 - float(cur_z5[0, 0, c0, 0].sum()))  # clipped: rounding can leave -1e-16
    stats = PolicyStats(value=float(first[0]), success=float(first[1]), cost=float(first[2]), turns=float(first[3]),
                        switch=switch, **({"prompt_tokens": float(first[at_q["P"]]),
                                           "cached_tokens": float(first[at_q["R"]])} if sim.prompt_cache else {}))
    return Solution(stats=stats, values=values, second_moment=moments, branches=full, block=sim.block, cache=cache,
                    models=models)


def _reading_states(policy: str | int, stacked: np.ndarray, none: np.ndarray, weights: np.ndarray, z_next: np.ndarray,
                    mask: np.ndarray, holder: np.ndarray, save: np.ndarray, read: np.ndarray, at_q: dict[str, int],
                    reward_of: float) -> tuple[np.ndarray, np.ndarray]:
    """The quantities (K, W, C_t, H', Q) and Z (K, W, C_t, H', M) in the H' cache states with a holder, from each
    model's quantities `stacked` (Q, K, W, M, C_t) and the policy's in state 0, `none` (Q, K, W, C_t).

    Only the holder's column differs from state 0: calling it again reads `read` (H', C_t) cached tokens and costs
    `save` dollars less (its return `reward_of` x save more). So per state: the holder's own quantities, adjusted;
    the policy's other choices are state 0's. Z is needed only for the holder (the model the state says was last)."""
    bonus = reward_of * save                                                        # (H', C_t)
    own = stacked[:, :, :, holder]                                                  # (Q, K, W, H', C_t)
    adjust = np.zeros((len(at_q), *save.shape))                                     # (Q, H', C_t)
    adjust[at_q["V"]], adjust[at_q["$"]], adjust[at_q["R"]] = bonus, -save, read
    if "W" in at_q:   # E[(G + b)^2] = E[G^2] + 2 b E[G] + b^2
        adjust = adjust[:, None, None] + np.zeros_like(own)
        adjust[at_q["W"]] = 2 * bonus * own[at_q["V"]] + bonus**2
    else:
        adjust = adjust[:, None, None]
    own = own + adjust
    z_own = np.take(z_next, holder, axis=2)                                         # (K, W, H', C_t)
    if policy == "oracle":
        # The state-0 argmax, and the best other model where the holder is it; the holder wins ties as the argmax
        # over all models would (the lower index first).
        value = np.where(mask[:, None], stacked[at_q["V"]], -np.inf)                # (K, W, M, C_t)
        best = np.argmax(value, axis=2)                                              # (K, W, C_t)
        second = np.argmax(np.where(np.arange(value.shape[2])[:, None] == best[:, :, None], -np.inf, value), axis=2)
        other = np.where(best[:, :, None] == holder[:, None], second[:, :, None], best[:, :, None])   # (K, W, H', C_t)
        other_value = np.take_along_axis(value, other, axis=2)
        mine = own[at_q["V"]]
        stay = mask[holder][:, None] & ((mine > other_value) | ((mine == other_value) & (holder[:, None] < other)))
        rest = np.take_along_axis(stacked, np.broadcast_to(other, (len(stacked), *other.shape)), axis=3)
        quantities = np.where(stay, own, rest)                                       # (Q, K, W, H', C_t)
        z = np.where(stay, z_own, 0.0)
    else:   # the random router and a fixed model do not read Q: state 0's weights, the holder's column adjusted
        w_own = np.take(weights, holder, axis=2)                                     # (K, W, H', C_t)
        quantities = none[:, :, :, None] + w_own * adjust
        z = w_own * z_own
    zs = np.ones((*z.shape[:2], z.shape[3], z.shape[2], weights.shape[2]))          # (K, W, C_t, H', M)
    zs[..., np.arange(len(holder)), holder] = np.moveaxis(z, 2, 3)
    return np.moveaxis(quantities, 0, -1).transpose(0, 1, 3, 2, 4), zs


def _policy_weights(policy: str | int, q_value: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(..., M, C) probability of calling each model at each prompt length, from Q of the same shape."""
    num_models = q_value.shape[-2]
    if policy == "oracle":
        best = np.argmax(np.where(mask[:, None], q_value, -np.inf), axis=-2)      # (..., C)
        return (best[..., None, :] == np.arange(num_models)[:, None]).astype(q_value.dtype)
    weights = np.zeros_like(q_value)
    if policy == "random":
        weights[..., mask, :] = 1.0 / mask.sum()
    else:
        if not mask[policy]:
            raise ValueError(f"fixed model {policy} is not available")
        weights[..., policy, :] = 1.0
    return weights


# --------------------------------------------------------------------------------------- aggregate reports


def policy_report(sim: RouteSim, split: str, reward: Reward,
                  available: Sequence[bool] | None = None, oracle_only: bool = False) -> dict[str, dict[str, float]]:
    """Exact accuracy, total cost (dollars, summed over the split's tasks), mean return, turns and switch rate
    of the oracle, every available fixed model and the random router on `split` (`oracle_only`: the oracle's)."""
    mask = np.ones(len(sim.pool), bool) if available is None else np.asarray(available, bool)
    policies = {"oracle": "oracle"} if oracle_only else {
        "oracle": "oracle", **{name: m for m, name in enumerate(sim.pool.names) if mask[m]}, "random": "random"}
    tasks = sim.sim_tasks(split)
    per_task = [branches(sim, t) for t in tasks]
    report = {}
    for name, policy in policies.items():
        stats = [solve(sim, t, reward, policy, available=mask, task_branches=b).stats
                 for t, b in zip(tasks, per_task)]
        report[name] = {"accuracy": float(np.mean([s.success for s in stats])),
                        "cost": float(np.sum([s.cost for s in stats])),
                        "return": float(np.mean([s.value for s in stats])),
                        "turns": float(np.mean([s.turns for s in stats])),
                        "switch_rate": float(np.mean([s.switch for s in stats]))}
        if sim.prompt_cache:   # the share of the split's prompt tokens billed as cached
            report[name]["cached_share"] = float(np.sum([s.cached_tokens for s in stats])
                                                 / np.sum([s.prompt_tokens for s in stats]))
    return report


def most_accurate_fixed(report: dict[str, dict[str, float]], pool_names: Sequence[str]) -> str:
    """The fixed model with the highest accuracy (ties: the cheaper), the paper's reference policy."""
    fixed = [n for n in pool_names if n in report]
    return max(fixed, key=lambda n: (report[n]["accuracy"], -report[n]["cost"]))


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Names whose (accuracy, cost) no other point beats on both (>= accuracy and <= cost, one strictly)."""
    def dominated(a, b):
        return b[0] >= a[0] and b[1] <= a[1] and (b[0] > a[0] or b[1] < a[1])

    return sorted(n for n, p in points.items() if not any(dominated(p, q) for m, q in points.items() if m != n))


# ------------------------------------------------------------------------ Proposition 4.1 on a logged corpus


def behaviour_policy(episode, pool_names: Sequence[str]) -> str | int:
    """The logged policy of an episode: a fixed model (propensity 1 at every turn) or the uniform random router."""
    if all(t.propensity == 1.0 for t in episode.turns) and len({t.model for t in episode.turns}) == 1:
        return list(pool_names).index(episode.turns[0].model)
    if all(t.propensity is not None and abs(t.propensity * len(pool_names) - 1) < 1e-9 for t in episode.turns):
        return "random"
    raise ValueError(f"episode {episode.episode_id}: behaviour policy is neither a fixed model nor uniform random")


def response_resolved_share(sim: RouteSim, episodes, reward: Reward) -> dict[str, float]:
    """Var(Delta | X) / Var(Y | X) of Proposition 4.1, exactly, over the logged transitions X = (s_t, m_t).

    Y is the Monte Carlo return G_t under the episode's own behaviour policy; the response O_t determines the
    branch taken, so E[Y | X, O] = r + gamma V(next state) and Var(Delta | X) = Var_O(E[Y | X, O]). Returns the
    ratio of sums over transitions (and the two sums).
    """
    cache: dict[tuple[str, object], Solution] = {}
    resolved = total = 0.0
    for episode in episodes:
        sim_task = sim.sim_task(episode.task.id)
        policy = behaviour_policy(episode, sim.pool.names)
        key = (sim_task.task.id, policy)
        if key not in cache:
            cache[key] = solve(sim, sim_task, reward, policy, second_moment=True)
        solution = cache[key]
        state = sim.reset(sim_task.task.id)
        for t, turn in enumerate(episode.turns):
            m = sim.pool.index(turn.model)
            given_o = _branch_returns(solution, sim, state, m, t, reward)  # (B, 3): p, E[Y|O], E[Y^2|O]
            p, mean_o, second_o = given_o.T
            mean = float(np.sum(p * mean_o))
            resolved += float(np.sum(p * mean_o**2)) - mean**2
            total += float(np.sum(p * second_o)) - mean**2
            state = sim.apply_response(state, turn.model, turn.response, turn.completion_tokens)
    return {"share": resolved / total if total > 0 else float("nan"), "var_delta": resolved, "var_y": total}


def _branch_returns(solution: Solution, sim: RouteSim, state, m: int, t: int, reward: Reward) -> np.ndarray:
    """Per branch when model m acts in `state` at turn t and `solution`'s policy continues: (probability,
    E[Y | branch], E[Y^2 | branch]); the last column is 0 when the solution has no second moments."""
    lam, gamma, c_ref = reward
    br = solution.branches
    k, w, c = state.step, state.wrong_proposals, state.context_tokens
    local = solution.models.index(m)   # m's index in the DP's own model axis
    input_cost = sim.input_cost(state, m)
    rows = []
    for b in range(br.prob.shape[1]):
        reward = -lam * (input_cost + br.cost_out[b, m]) / c_ref + br.correct[k, b]
        wrong = w + br.wrong[k, b]
        done = br.correct[k, b] > 0 or wrong >= sim.max_proposals or t + 1 >= sim.max_turns
        if done:
            v = second = 0.0
        else:
            index = (t + 1, k + br.advance[k, b], wrong, c // solution.block + br.tokens[k, b, m],
                     solution.cache.after[k, b, local])
            v = solution.values[index]
            second = 0.0 if solution.second_moment is None else solution.second_moment[index]
        rows.append((br.prob[k, b, m], reward + gamma * v, reward**2 + 2 * gamma * reward * v + gamma**2 * second))
    return np.array(rows)


def hidden_state(sim: RouteSim, task_id: str, history) -> SimState:
    """Replays a history through the environment (identity-blind, so the logged models do not matter) to the
    hidden state before the next turn."""
    state = sim.reset(task_id)
    for turn in history:
        state = sim.apply_response(state, turn.model, turn.response, turn.completion_tokens)
    return state


class OraclePolicy:
    """The optimal router as a policy: reads the hidden state (which a real router cannot) and takes the argmax of
    the exact Q at it, over the available models."""

    def __init__(self, sim: RouteSim, reward: Reward, name: str = "oracle"):
        self.sim, self.reward, self.name = sim, reward, name
        self._solutions: dict[tuple[str, tuple[bool, ...]], Solution] = {}

    def q_values(self, task_id: str, history, available) -> np.ndarray:
        """(M,) exact Q(s, m) under optimal continuation; -inf for unavailable models."""
        mask = tuple(name in available for name in self.sim.pool.names)
        key = (task_id, mask)
        if key not in self._solutions:
            self._solutions[key] = solve(self.sim, self.sim.sim_task(task_id), self.reward,
                                         "oracle", available=mask)
        state = hidden_state(self.sim, task_id, history)
        q = np.full(len(mask), -np.inf)
        for m in np.flatnonzero(mask):
            p, mean, _ = _branch_returns(self._solutions[key], self.sim, state, m, len(history), self.reward).T
            q[m] = float(np.sum(p * mean))
        return q

    def act(self, task, history, available, rng):
        return self.sim.pool.names[int(np.argmax(self.q_values(task.id, history, available)))], 1.0
