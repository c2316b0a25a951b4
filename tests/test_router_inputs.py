"""The Router refuses what it cannot route on (issue 14): every case used to return a model silently."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from rivet_jax.data.cards import card_features
from rivet_jax.encoders import HashingEncoder
from rivet_jax.envs.collect import demo_corpus
from rivet_jax.networks import init_params, make_network
from rivet_jax.router import Router

TASK = "Compute the sum of the first 10 primes."


@pytest.fixture(scope="module")
def router() -> Router:
    """An untrained router (random parameters): input handling does not depend on training."""
    config = default.get_config("tiny")
    pool = demo_corpus(0)[0].pool
    encoder = HashingEncoder(dim=config.encoder.dim)
    cards = encoder.encode([card.description for card in pool.cards])
    params = init_params(make_network(config), jax.random.key(0), encoder.dim,
                         (jnp.asarray(cards), *map(jnp.asarray, card_features(pool))))
    return Router(params, pool, encoder, config, cards, c_ref=1.0)


def test_availability_from_a_generator_or_filter(router):
    subset = list(router.pool.names[2:4])
    expected = router.route(TASK, available=subset)
    assert expected.model in subset
    # A generator is read once; reading it twice used to leave an all-masked row whose argmax was the pool's first.
    assert router.route(TASK, available=(name for name in subset)) == expected
    assert router.route(TASK, available=filter(lambda name: name in subset, router.pool.names)) == expected
    with pytest.raises(ValueError, match="no available model"):
        router.route(TASK, available=iter(()))
    with pytest.raises(TypeError, match="not one string"):
        router.route(TASK, available=subset[0])


def test_an_all_masked_row_is_an_error_not_an_argmax(router):
    h = router.encoder.encode([router.state_text(TASK, [])] * 2)
    mask = np.ones((2, len(router.pool)), bool)
    mask[1] = False
    with pytest.raises(ValueError, match=r"no available model for states \[1\]"):
        router.scores_from_embeddings(h, mask)


def test_one_availability_per_state(router):
    states = [(TASK, []), (TASK, [{"response": "x", "feedback": "y"}])]
    with pytest.raises(ValueError, match="available has 1 entries for 2 states"):
        router.scores(states, [list(router.pool.names[:2])])
    q = router.scores(states, [list(router.pool.names[:2]), None])
    assert np.isinf(q[0, 2:]).all() and np.isfinite(q[1]).all()


@pytest.mark.parametrize("task", [None, 123, b"bytes", ["a list"]])
def test_a_task_must_be_a_string(router, task):
    with pytest.raises(TypeError, match="the task must be a string"):
        router.route(task)


def test_history_texts_must_be_strings(router):
    with pytest.raises(TypeError, match=r"history\[0\]\['feedback'\] must be a string, got NoneType"):
        router.route(TASK, [{"response": "x", "feedback": None}])


def test_non_finite_parameters_do_not_route(router):
    nan = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), router._params)   # (1, ...) per leaf
    poisoned = Router(nan, router.pool, router.encoder, router.config, router._card_embeddings, c_ref=1.0,
                      stacked=True)
    with pytest.raises(FloatingPointError, match="non-finite scores"):
        poisoned.route(TASK)


def test_scores_of_many_states_are_taken_in_chunks_that_score_as_one_call(router, monkeypatch):
    """Scoring is chunked (`SCORED_ROWS` states per network call, so a 49-model pool's tens of thousands of states do
    not hold GBs of activations): 7 states in chunks of 3 (3, 3, 1, each padded) score as in one call."""
    h = router.encoder.encode([router.state_text(f"{TASK} ({k})", []) for k in range(7)])
    whole = router.scores_from_embeddings(h)
    monkeypatch.setattr("rivet_jax.router.SCORED_ROWS", 3)
    chunked = router.scores_from_embeddings(h)
    assert chunked.shape == (7, len(router.pool))
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)
    assert router.scores_from_embeddings(h[:0]).shape == (0, len(router.pool))
