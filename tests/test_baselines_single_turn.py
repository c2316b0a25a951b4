"""Single-turn baselines: the task-model table, each router's choice on a corpus whose answer is known by
construction, cost-awareness, availability, commit-once behaviour, determinism, and one RouteSim episode each."""

import numpy as np
import pytest

from configs import routesim as routesim_config
from rivet_jax.baselines import single_turn as st
from rivet_jax.data.replay import reference_cost
from rivet_jax.data.schema import Episode, ModelCard, ModelPool, Task, Turn
from rivet_jax.encoders import EmbeddingStore, HashingEncoder, make_encoder
from rivet_jax.envs.base import run_episode
from rivet_jax.envs.collect import collect_corpus
from rivet_jax.envs.routesim import make_routesim

# alpha: the maths specialist, beta: the geography specialist, gamma: cheap, good only at poems.
MODELS = ("alpha", "beta", "gamma")
# Episode costs in USD. The gap is wide enough (LAM * 3.9 / C_REF = 0.39 of utility) that a learned success estimate
# for an unseen prompt, which is never exactly 1 and 1, cannot hide it.
COST = {"alpha": 4.0, "beta": 4.0, "gamma": 0.1}
C_REF = 1.0
LAM = 0.1
GROUPS = {
    "math": ("integral derivative equation calculus: solve the {} integral and take its derivative",
             {"alpha": 1, "beta": 0, "gamma": 0}),
    "geo": ("capital country river geography: name the capital of the {} country on the river",
            {"alpha": 0, "beta": 1, "gamma": 0}),
    "poem": ("poem sonnet rhyme verse stanza: write a {} sonnet whose verse and stanza rhyme",
             {"alpha": 1, "beta": 0, "gamma": 1}),
}
TRAIN_WORDS = ("red", "blue", "green", "small", "old", "quiet")
# Unseen prompts, one per group: the group's wording around a word no training task has.
QUERIES = {group: template.format("yellow") for group, (template, _) in GROUPS.items()}
EXPECTED = {"math": "alpha", "geo": "beta", "poem": "gamma"}  # at LAM > 0


def make_pool():
    return ModelPool(tuple(ModelCard(name=name, description=f"model {name}") for name in MODELS))


def make_episode(episode_id, task, models, outcome, cost, propensity):
    turns = tuple(Turn(model=model, response="<solution> x </solution>", feedback="Observation: ok",
                       prompt_tokens=100, completion_tokens=20, cost=cost / len(models), propensity=propensity)
                  for model in models)
    return Episode(episode_id=episode_id, task=task, turns=turns, outcome=outcome)


def group_tasks():
    return [(group, Task(id=f"{group}-{i}", prompt=template.format(word), family=group))
            for group, (template, _) in GROUPS.items() for i, word in enumerate(TRAIN_WORDS)]


def fixed_episodes(outcomes_of=None):
    """One two-turn episode per task and model, every turn by that model (a fixed-model policy); outcomes per group
    and model from `outcomes_of` (default GROUPS')."""
    episodes = []
    for group, task in group_tasks():
        outcomes = (outcomes_of or {g: y for g, (_, y) in GROUPS.items()})[group]
        for model in MODELS:
            episodes.append(make_episode(f"fixed:{model}/{task.id}", task, [model, model], outcomes[model],
                                         COST[model], 1.0))
    return episodes


def random_episodes():
    """A random router's episodes that would mislead if used: gamma 'succeeding' at maths and geography."""
    episodes = []
    for group, task in group_tasks():
        if group != "poem":
            episodes.append(make_episode(f"random/{task.id}", task, ["gamma", "gamma"], 1, 0.1, 1 / 3))
            episodes.append(make_episode(f"random2/{task.id}", task, ["gamma", "beta"], 1, 0.5, 1 / 3))
    return episodes


def make_store():
    return EmbeddingStore(HashingEncoder(dim=64))


FIT_KWARGS = {
    "knn": dict(k=4),
    "cluster": dict(clusters=3, seed=0),
    "embedllm": dict(rank=8, steps=300, lr=1e-2, seed=0),
    "routerdc": dict(margin=0.01, steps=200, lr=3e-3, seed=0),
}
ROUTERS = {"knn": st.KNNRouter, "cluster": st.ClusterRouter, "embedllm": st.MatrixFactorizationRouter,
           "routerdc": st.ContrastiveRouter}
UTILITY_ROUTERS = ("knn", "cluster", "embedllm")


def fit(name, lam=LAM, **overrides):
    episodes = fixed_episodes() + random_episodes()
    return ROUTERS[name].fit(episodes, make_pool(), make_store(), lam, C_REF, **{**FIT_KWARGS[name], **overrides})


@pytest.fixture(scope="module")
def routers():
    return {name: fit(name) for name in ROUTERS}


def query_task(group):
    return Task(id=f"query-{group}", prompt=QUERIES[group], family=group)


# ------------------------------------------------------------------------------------------------------ the table


def test_table_averages_single_model_episodes_and_ignores_the_random_router():
    pool = make_pool()
    table = st.build_task_model_table(fixed_episodes(), pool)
    mixed = st.build_task_model_table(random_episodes() + fixed_episodes(), pool)
    assert mixed.task_ids == table.task_ids and mixed.prompts == table.prompts
    for field in ("success", "cost", "count"):
        np.testing.assert_array_equal(getattr(mixed, field), getattr(table, field))
    assert table.models == MODELS and len(table.task_ids) == 18
    np.testing.assert_array_equal(table.count, np.ones((18, 3)))
    row = table.task_ids.index("poem-2")
    np.testing.assert_allclose(table.success[row], [1, 0, 1])
    np.testing.assert_allclose(table.cost[row], [4.0, 4.0, 0.1])
    np.testing.assert_allclose(table.utility(0.5, 2.0)[row], [0.0, -1.0, 0.975])
    # A repeated cell is averaged; an unobserved cell is NaN with count 0.
    task = Task(id="extra", prompt="one more maths integral")
    extra = [make_episode("a", task, ["alpha"], 1, 2.0, 1.0), make_episode("b", task, ["alpha"], 0, 4.0, 1.0)]
    table = st.build_task_model_table(fixed_episodes() + extra, pool)
    assert table.task_ids[-1] == "extra"
    np.testing.assert_array_equal(table.count[-1], [2, 0, 0])
    assert table.success[-1, 0] == 0.5 and table.cost[-1, 0] == 3.0 and np.isnan(table.success[-1, 1:]).all()


def test_graded_outcomes_are_averaged_and_ranked_by_utility():
    """Graded outcomes in [0, 1] enter the table and the utility as they are. On maths (alpha 0.75, beta 0.25,
    gamma 0.5 at LAM 0.1, C_REF 1) the utilities are 0.75 - 0.4 = 0.35, 0.25 - 0.4 = -0.15, 0.5 - 0.01 = 0.49:
    the cheap half-right gamma beats the dear mostly-right alpha; kNN and the cluster router take the
    neighbourhood's means, every neighbour of the maths query being a maths task."""
    graded = {"math": {"alpha": 0.75, "beta": 0.25, "gamma": 0.5}, "geo": {"alpha": 0.1, "beta": 0.9, "gamma": 0.0},
              "poem": {"alpha": 1, "beta": 0, "gamma": 0.3}}
    pool = make_pool()
    episodes = fixed_episodes(graded)
    task = Task(id="math-0", prompt=GROUPS["math"][0].format("red"))
    repeat = make_episode("again", task, ["alpha"], 0.25, COST["alpha"], 1.0)  # the cell's mean: (0.75 + 0.25) / 2
    table = st.build_task_model_table(episodes + [repeat], pool)
    np.testing.assert_allclose(table.success[table.task_ids.index("math-0")], [0.5, 0.25, 0.5])
    expected = [0.75 - LAM * COST["alpha"], 0.25 - LAM * COST["beta"], 0.5 - LAM * COST["gamma"]]
    for name in ("knn", "cluster"):
        router = ROUTERS[name].fit(episodes, pool, make_store(), LAM, C_REF, **FIT_KWARGS[name])
        np.testing.assert_allclose(router.scores([QUERIES["math"]])[0], expected, err_msg=name)
        assert router.act(query_task("math"), (), MODELS, None) == ("gamma", 1.0)


def test_table_errors_name_the_problem():
    pool = make_pool()
    with pytest.raises(ValueError, match="no single-model episode among 24 episodes"):
        st.build_task_model_table(random_episodes(), pool)
    without_beta = [e for e in fixed_episodes() if e.turns[0].model != "beta"]
    with pytest.raises(ValueError, match=r"\['beta'\] never observed"):
        st.build_task_model_table(without_beta, pool)
    with pytest.raises(ValueError, match=r"\['beta'\] never observed"):
        st.KNNRouter.fit(without_beta, pool, make_store(), LAM, C_REF)
    renamed = make_episode("x", Task(id="math-0", prompt="another prompt"), ["alpha"], 1, 1.0, 1.0)
    with pytest.raises(ValueError, match="'math-0' appears with two different prompts"):
        st.build_task_model_table(fixed_episodes() + [renamed], pool)
    with pytest.raises(ValueError, match="c_ref"):
        st.KNNRouter.fit(fixed_episodes(), pool, make_store(), LAM, 0.0)
    with pytest.raises(ValueError, match="lam"):
        st.ClusterRouter.fit(fixed_episodes(), pool, make_store(), -1.0, C_REF)


# -------------------------------------------------------------------------------------- choices known by construction


@pytest.mark.parametrize("name", list(ROUTERS))
def test_each_group_goes_to_its_model(routers, name):
    router = routers[name]
    assert router.name == name
    scores = router.scores([QUERIES[g] for g in GROUPS])
    assert scores.shape == (3, 3) and np.isfinite(scores).all()
    for group, expected in EXPECTED.items():
        assert router.act(query_task(group), (), MODELS, np.random.default_rng(0)) == (expected, 1.0), group


def test_knn_and_cluster_utilities_are_the_neighbourhood_means(routers):
    # Every neighbour of the poem query is a poem task: alpha and gamma both succeed, gamma is cheaper.
    for name in ("knn", "cluster"):
        poem = routers[name].scores([QUERIES["poem"]])[0]
        np.testing.assert_allclose(poem, [1 - LAM * COST["alpha"], -LAM * COST["beta"], 1 - LAM * COST["gamma"]],
                                   err_msg=name)
    rows, weights = routers["knn"].neighbours(st.task_embeddings(routers["knn"].store, [QUERIES["math"]]))
    assert all(routers["knn"].table.task_ids[r].startswith("math") for r in rows[0]) and (weights > 0).all()


@pytest.mark.parametrize("name", list(ROUTERS))
def test_cost_awareness_the_cheaper_of_two_successful_models_wins(name):
    task = query_task("poem")
    for lam in (LAM, 0.5):
        router = fit(name, lam=lam)
        scores = router.task_scores(task)
        assert scores[MODELS.index("gamma")] > scores[MODELS.index("alpha")], lam
        assert router.act(task, (), MODELS, None)[0] == "gamma"
    free = fit(name, lam=0.0)
    if name in ("knn", "cluster"):
        # Without the cost term the two tie exactly (both always succeed): the preference came from cost alone.
        scores = free.task_scores(task)
        assert scores[0] == scores[2]
    elif name == "embedllm":
        # Training does not depend on lam; lam only weighs the two heads' estimates.
        success, cost = free.estimates(st.task_embeddings(free.store, [task.prompt]))
        np.testing.assert_allclose(free.task_scores(task), success[0], rtol=1e-6)
        np.testing.assert_allclose(router.task_scores(task), success[0] - 0.5 * cost[0] / C_REF, rtol=1e-6)


def test_matrix_factorization_estimates_cost_and_success(routers):
    router = routers["embedllm"]
    success, cost = router.estimates(st.task_embeddings(router.store, [QUERIES["math"], QUERIES["poem"]]))
    assert success[0, 0] > 0.5 > success[0, 1] and success[1, 2] > 0.5
    assert (cost[:, 2] < cost[:, 0]).all() and np.isfinite(router.losses).all()
    assert router.losses[-1] < router.losses[0]


# ---------------------------------------------------------------------------------------- the multi-turn policy


@pytest.mark.parametrize("name", list(ROUTERS))
def test_unavailable_choice_falls_back_to_the_best_available(routers, name):
    router = routers[name]
    task = query_task("math")
    available = ("beta", "gamma")
    model, _ = router.act(task, (), available, None)
    scores = router.task_scores(task)
    assert model == available[int(np.argmax([scores[MODELS.index(m)] for m in available]))]
    if name in UTILITY_ROUTERS:
        assert model == "gamma"  # both fail at maths; gamma costs less
    with pytest.raises(ValueError, match="not in the pool"):
        router.act(task, (), ("alpha", "delta"), None)


def turn_by(model):
    return Turn(model=model, response="<execute>print(1)</execute>", feedback="Observation: 1", prompt_tokens=10,
                completion_tokens=5, cost=0.01)


@pytest.mark.parametrize("name", list(ROUTERS))
def test_the_first_choice_is_kept_across_turns(routers, name):
    router = routers[name]
    task = query_task("geo")
    first, _ = router.act(task, (), MODELS, None)
    assert first == "beta"
    requested = router.store.stats["requested"]
    assert router.act(task, (turn_by(first),), MODELS, None) == (first, 1.0)
    assert router.act(task, (turn_by(first), turn_by(first)), MODELS, None) == (first, 1.0)
    assert router.store.stats["requested"] == requested  # the task's scores are cached by task id
    # The kept model is the one that answered last, even where a fresh choice would differ ...
    assert router.act(task, (turn_by("gamma"),), MODELS, None)[0] == "gamma"
    # ... until it is withdrawn: then a new choice among the available ones.
    assert router.act(task, (turn_by("gamma"),), ("alpha", "beta"), None)[0] == "beta"


@pytest.mark.parametrize("name", ["cluster", "embedllm", "routerdc"])
def test_same_seed_same_scores(routers, name):
    prompts = list(QUERIES.values())
    np.testing.assert_array_equal(fit(name).scores(prompts), routers[name].scores(prompts))
    if name != "cluster":  # three well-separated groups: k-means finds them from any start
        assert not np.array_equal(fit(name, seed=1).scores(prompts), routers[name].scores(prompts))


def test_kmeans_is_deterministic_and_stops_at_distinct_points():
    x = np.repeat(np.eye(3), 4, axis=0)  # 12 points, 3 distinct
    centroids = st.kmeans(x, clusters=5, seed=3)
    assert centroids.shape == (3, 3)
    assert sorted(map(tuple, centroids)) == sorted(map(tuple, np.eye(3)))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4))
    np.testing.assert_array_equal(st.kmeans(x, 4, seed=7), st.kmeans(x, 4, seed=7))


def test_contrastive_loss_and_positives():
    utility = np.array([[0.9, 0.0, 0.895], [np.nan, 0.2, -0.1], [0.5, 0.5, 0.5]])
    positive, negative = st.positive_models(utility, margin=0.01)
    np.testing.assert_array_equal(positive, [[1, 0, 1], [0, 1, 0], [1, 1, 1]])
    np.testing.assert_array_equal(negative, [[0, 1, 0], [0, 0, 1], [0, 0, 0]])
    similarity = np.array([[1.0, -1.0, 1.0], [0.0, 0.5, 0.0], [0.3, 0.1, 0.2]], np.float32)
    loss = float(st.sample_llm_contrastive(similarity, positive, negative, 0.5))
    # Task 3 has no negative and is left out; tasks 1 and 2: -log(e^{s_p/t} / (e^{s_p/t} + e^{s_n/t})).
    expected = np.mean([np.log1p(np.exp((-1.0 - 1.0) / 0.5)), np.log1p(np.exp((0.0 - 0.5) / 0.5))])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_scores_refuses_a_bare_string(routers):
    with pytest.raises(TypeError, match="single str"):
        routers["knn"].scores("a prompt")


# ------------------------------------------------------------------------------------------------------- RouteSim


def test_each_router_runs_an_episode_on_tiny_routesim():
    config = routesim_config.get_config("tiny")
    sim = make_routesim(config.sim)
    corpus = collect_corpus(sim, "train", seed=0)
    c_ref = reference_cost(corpus)
    store = EmbeddingStore(make_encoder(config.encoder))
    task = sim.tasks("test")[0]
    small = {"embedllm": dict(steps=50), "routerdc": dict(steps=50), "cluster": dict(clusters=3), "knn": dict(k=3)}
    for name, cls in ROUTERS.items():
        router = cls.fit(corpus, sim.pool, store, config.reward.lam, c_ref, **small[name])
        assert router.scores([task.prompt]).shape == (1, len(sim.pool))
        episode = run_episode(sim, task.id, router, np.random.default_rng(0), episode_id=f"{name}/{task.id}")
        models = {turn.model for turn in episode.turns}
        assert models == {router.choose(task, sim.pool.names)}, name
        assert all(turn.propensity == 1.0 for turn in episode.turns)
