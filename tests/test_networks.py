"""The shared representation and the two heads: shapes, sharing, and the deployable subset."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from rivet_jax.networks import RVE_MODULES, RivetNet, init_params, make_network, rve_params

B, M, D, F = 5, 4, 32, 3


@pytest.fixture(scope="module")
def setup():
    net = make_network(default.get_config("tiny"))
    # jit'ed apply: the same numbers, without compiling every op separately (keeps the tests fast)
    net.apply = jax.jit(net.apply, static_argnames="method")
    rng = np.random.default_rng(0)
    cards = (jnp.asarray(rng.normal(size=(M, D)), jnp.float32), jnp.asarray(rng.normal(size=(M, F)), jnp.float32),
             jnp.ones((M, F), jnp.float32))
    params = init_params(net, jax.random.key(0), D, cards)
    h = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    e_o = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
    return net, params, cards, h, e_o


def test_shapes_and_separate_heads(setup):
    net, params, cards, h, e_o = setup
    q, q_resp = net.apply({"params": params}, h, cards, jnp.arange(B) % M, e_o, method=RivetNet.q_both)
    assert q.shape == (B, M) and q_resp.shape == (B,)
    assert set(params) == {"card_projector", "state_adapter", "route_head", "response_projector", "resp_head"}
    # two heads of the same architecture, but their own parameters
    assert jax.tree.structure(params["route_head"]) == jax.tree.structure(params["resp_head"])
    assert not np.allclose(params["route_head"]["out"]["kernel"], params["resp_head"]["out"]["kernel"])


def test_candidates_scored_together_equal_scored_alone(setup):
    """Scoring M candidates at once is the same function as scoring each card on its own."""
    net, params, cards, h, _ = setup
    together = net.apply({"params": params}, h, cards, method=RivetNet.q_route)
    for m in range(M):
        alone = net.apply({"params": params}, h, tuple(c[m:m + 1] for c in cards), method=RivetNet.q_route)
        np.testing.assert_allclose(alone[:, 0], together[:, m], rtol=1e-5, atol=1e-6)


def test_route_values_need_only_rve_params_and_ignore_responses(setup):
    net, params, cards, h, e_o = setup
    deployable = rve_params(params)
    assert set(deployable) == set(RVE_MODULES)
    q_full = net.apply({"params": params}, h, cards, method=RivetNet.q_route)
    q_rve = net.apply({"params": deployable}, h, cards, method=RivetNet.q_route)
    np.testing.assert_array_equal(q_full, q_rve)
    # Q_resp reads the response; Q_route from q_both does not
    actions = jnp.zeros(B, jnp.int32)
    q_a, resp_a = net.apply({"params": params}, h, cards, actions, e_o, method=RivetNet.q_both)
    q_b, resp_b = net.apply({"params": params}, h, cards, actions, jnp.zeros_like(e_o), method=RivetNet.q_both)
    np.testing.assert_array_equal(q_a, q_b)
    assert not np.allclose(resp_a, resp_b)


def test_rive_gradient_reaches_the_shared_representation(setup):
    """The auxiliary loss shapes the representation RVE uses: its gradient is non-zero on the shared modules and
    zero on the RVE head."""
    net, params, cards, h, e_o = setup

    def rive_loss(p):
        _, q_resp = net.apply({"params": p}, h, cards, jnp.zeros(B, jnp.int32), e_o, method=RivetNet.q_both)
        return jnp.sum(q_resp**2)

    grads = jax.grad(rive_loss)(params)
    norm = lambda tree: float(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))
    assert norm(grads["state_adapter"]) > 0 and norm(grads["card_projector"]) > 0
    assert norm(grads["route_head"]) == 0


def test_initialisation_is_flax_default_distribution_from_one_draw():
    """Same tree and shapes as flax's own init; LeCun-normal kernels (variance 1 / fan_in, a normal truncated at +-2),
    zero biases, unit LayerNorm scales; kernels independent of each other."""
    net = make_network(default.get_config())
    d, m, f = 1024, 6, 3
    cards = (jnp.zeros((m, d)), jnp.zeros((m, f)), jnp.ones((m, f)))
    params = init_params(net, jax.random.key(1), d, cards)
    reference = net.init(jax.random.key(1), jnp.zeros((1, d)), cards, jnp.zeros((1,), jnp.int32),
                         jnp.zeros((1, d)))["params"]
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, reference)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    kernels = [np.asarray(leaf) for path, leaf in flat if path[-1].key == "kernel"]
    for path, leaf in flat:
        leaf = np.asarray(leaf)
        if path[-1].key == "kernel" and leaf.size >= 8192:  # enough samples for a 5% check of the spread
            std = 1 / np.sqrt(leaf.shape[0])
            assert abs(leaf.std() / std - 1) < 0.05, (path, leaf.std(), std)
            assert np.abs(leaf).max() <= 2 * std / 0.8796 + 1e-6  # +-2 before rescaling to unit variance
        elif path[-1].key != "kernel":
            assert np.all(leaf == (1.0 if path[-1].key == "scale" else 0.0)), path
    first, second = kernels[0].ravel()[:1000], kernels[1].ravel()[:1000]
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.15  # distinct slices of the draw, not one repeated


def test_card_input_columns_by_hand():
    from rivet_jax.data.cards import input_columns

    # x_m: context, price in, price out, then two flags
    np.testing.assert_array_equal(input_columns(("prices",), 5), [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(input_columns(("context", "flags"), 5), [1, 0, 0, 1, 1])
    np.testing.assert_array_equal(input_columns(("description",), 5), [0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="card inputs must be distinct groups"):
        input_columns(("size",), 5)


@pytest.mark.parametrize("dropped", ["description", "context", "prices", "flags"])
def test_a_dropped_card_input_changes_nothing_and_the_others_still_count(setup, dropped):
    """Without one card input, Q_route no longer moves when that input changes (the same parameters); with every
    input (the default) it does, and the default network is the one without the option."""
    net, params, cards, h, _ = setup
    f = 5
    rng = np.random.default_rng(1)
    cards = (cards[0], jnp.asarray(rng.normal(size=(M, f)), jnp.float32), jnp.ones((M, f), jnp.float32))
    params = init_params(net, jax.random.key(0), D, cards)
    changed_e = cards[0] + 1.0
    changed_x = cards[1].at[:, {"description": [], "context": [0], "prices": [1, 2], "flags": [3, 4]}[dropped]].add(1.0)
    moved = (changed_e, changed_x, cards[2]) if dropped == "description" else (cards[0], changed_x, cards[2])
    kept = tuple(g for g in ("description", "context", "prices", "flags") if g != dropped)
    ablated = RivetNet(hidden=net.hidden, card_dim=net.card_dim, head_hidden=net.head_hidden,
                       response_dim=net.response_dim, card_inputs=kept)
    q = lambda n, c: np.asarray(n.apply({"params": params}, h, c, method=RivetNet.q_route))  # noqa: E731
    np.testing.assert_array_equal(q(ablated, moved), q(ablated, cards))
    assert not np.allclose(q(net, moved), q(net, cards))
    np.testing.assert_array_equal(q(net, cards), q(RivetNet(hidden=net.hidden, card_dim=net.card_dim,
                                                           head_hidden=net.head_hidden,
                                                           response_dim=net.response_dim), cards))


def test_the_card_inputs_setting_is_checked():
    from rivet_jax.config_checks import check_config
    from rivet_jax.settings import with_overrides

    with pytest.raises(ValueError, match="model.card_inputs"):
        check_config(with_overrides(default.get_config("tiny"), {"model.card_inputs": ("size",)}))
