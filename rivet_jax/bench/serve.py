"""The routing proxy's overhead (`python -m launch.benchmark --serve`): request in -> upstream request out.

The proxy runs in its own process (spawned, so its threads and the GIL are its own) with a router of the config's
network shape (random parameters: the overhead does not depend on their values) over the six-model RouteSim pool,
each model served by a fake upstream (`serve.fake`) in this process. Clients each drive multi-turn conversations
that grow by a turn of `feedback_words` words per request; the proxy's `x-rivet-routing-ms` header is the
overhead: reading the request, the state, the encoder, Q_route and the choice, until the upstream call goes out.
The upstream, the network and recording the turn afterwards are not in it.

Scenarios, (clients, upstream latency in s): (1, 0) one client alone; (16, 0.5) sixteen agents at once whose model
calls take half a second (an LLM answering) and who spend up to as long again on their tools between calls (a
random wait, so that they do not arrive in lockstep): the load a proxy in front of agents sees; (16, 0) sixteen clients
that send the next request the moment the last one returns: the proxy saturated, every request queueing behind the
others for the 2 cores the proxy shares with the clients and upstreams here, so its overhead there is mostly
waiting, and its requests/s the proxy's throughput on this machine.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import tempfile
import time

import httpx
import ml_collections
import numpy as np

from rivet_jax.serve.fake import ServerThread, fake_upstream, free_port

__all__ = ["serve_overhead", "format_serve_rows"]

SCENARIOS = ((1, 0.0), (16, 0.5), (16, 0.0))   # (concurrent clients, upstream latency in seconds)
_WORDS = ("route", "model", "tool", "result", "error", "value", "step", "answer", "check", "file", "test", "call")


def serve_overhead(config: ml_collections.ConfigDict, settings: ml_collections.ConfigDict,
                   encoders=("hashing", "minilm"), scenarios=SCENARIOS, conversations: int = 32, turns: int = 8,
                   feedback_words: int = 150) -> dict:
    """{encoder: {scenario: {clients, upstream_latency_s, p50_ms, p99_ms, mean_ms, requests, requests_per_s}}}
    (module docstring): `config` gives the network's shape, `settings` the proxy's (configs/serve.py; its backends
    and port are set here). The `conversations` of `turns` requests each are shared out over the clients, so every
    scenario has as many requests."""
    from rivet_jax.envs.collect import demo_corpus

    pool = demo_corpus(0)[0].pool
    modes = {name: {} for name in pool.names}
    upstreams = [ServerThread(fake_upstream(name, modes[name])) for name in pool.names]
    for server in upstreams:
        server.__enter__()
    try:
        backends = {name: {"base_url": server.url + "/v1", "model": name, "api_key_env": ""}
                    for name, server in zip(pool.names, upstreams)}
        return {encoder: _one_encoder(config, settings, encoder, backends, modes, scenarios, conversations, turns,
                                      feedback_words)
                for encoder in encoders}
    finally:
        for server in upstreams:
            server.__exit__()


def _one_encoder(config, settings, encoder: str, backends: dict, modes: dict, scenarios, conversations: int,
                 turns: int, feedback_words: int) -> dict:
    port = free_port()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as logdir:
        process = context.Process(target=_run_proxy, args=(config.to_dict(), settings.to_dict(), encoder, backends, port, logdir),
                                  daemon=True)
        process.start()
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_up(url, process)
            asyncio.run(_drive(url, 1, 1, 2, feedback_words, "warm-up"))   # compiles Q_route, loads the encoder
            rows = {}
            for clients, latency in scenarios:
                for mode in modes.values():
                    mode["latency_s"] = latency
                tag = f"{clients}-clients-{latency:g}s"
                overheads, seconds = asyncio.run(_drive(url, clients, max(1, conversations // clients), turns,
                                                        feedback_words, tag, think_s=latency))
                rows[tag] = {"clients": clients, "upstream_latency_s": latency, **_summary(overheads, seconds)}
            return rows
        finally:
            process.terminate()
            process.join(timeout=30)


def _run_proxy(config: dict, settings: dict, encoder_name: str, backends: dict, port: int, logdir: str) -> None:
    """The proxy process: a random-parameter router of the config's shape behind `serve.app.serve`."""
    import jax
    import jax.numpy as jnp

    from rivet_jax.data.cards import card_features
    from rivet_jax.encoders import make_encoder
    from rivet_jax.envs.collect import demo_corpus
    from rivet_jax.networks import init_params, make_network
    from rivet_jax.router import Router
    from rivet_jax.serve.app import serve
    from rivet_jax.serve.proxy import Proxy
    from rivet_jax.serve.recorder import Recorder
    from rivet_jax.serve.upstream import backends_from_config

    config = ml_collections.ConfigDict(config)
    config.encoder = ml_collections.ConfigDict({"name": encoder_name, "dim": config.encoder.dim})
    encoder = make_encoder(config.encoder)
    pool = demo_corpus(0)[0].pool
    cards = encoder.encode([card.description for card in pool.cards])
    params = init_params(make_network(config), jax.random.key(0), cards.shape[1],
                         (jnp.asarray(cards), *map(jnp.asarray, card_features(pool))))
    router = Router(params, pool, encoder, config, cards, c_ref=1.0)
    settings = ml_collections.ConfigDict(settings)
    settings.port = port
    serve(Proxy(router, backends_from_config(backends, pool), Recorder(logdir, pool), settings))


def _wait_until_up(url: str, process, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.is_alive():
            raise RuntimeError(f"the benchmark's proxy process exited with status {process.exitcode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the benchmark's proxy did not start")


async def _drive(url: str, clients: int, conversations: int, turns: int, feedback_words: int, tag: str,
                 think_s: float = 0.0) -> tuple[list[float], float]:
    """`clients` concurrent clients, each with `conversations` conversations of `turns` requests: (the routing
    overhead of every request in ms, wall seconds). With `think_s` > 0 each client starts at a random moment within
    it and waits a random time within it before each request (the agent running its tools), so that independent
    agents do not arrive in lockstep."""
    overheads: list[float] = []

    async def client(k: int, http: httpx.AsyncClient) -> None:
        rng = np.random.default_rng(k)
        for c in range(conversations):
            messages = [{"role": "user", "content": f"Task {tag}-{k}-{c}: " + _words(rng, feedback_words)}]
            for _ in range(turns):
                if think_s > 0:
                    await asyncio.sleep(float(rng.uniform(0, think_s)))
                response = await http.post(f"{url}/v1/chat/completions", json={"model": "rivet",
                                                                                "messages": messages},
                                           headers={"x-rivet-session": f"{tag}-{k}-{c}"})
                response.raise_for_status()
                overheads.append(float(response.headers["x-rivet-routing-ms"]))
                messages += [response.json()["choices"][0]["message"],
                             {"role": "user", "content": _words(rng, feedback_words)}]

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(*(client(k, http) for k in range(clients)))
    return overheads, time.perf_counter() - start


def _words(rng: np.random.Generator, count: int) -> str:
    return " ".join(_WORDS[i] + str(j) for i, j in zip(rng.integers(len(_WORDS), size=count),
                                                       rng.integers(100, size=count)))


def _summary(overheads: list[float], seconds: float) -> dict:
    values = np.asarray(overheads)
    return {"p50_ms": float(np.percentile(values, 50)), "p99_ms": float(np.percentile(values, 99)),
            "mean_ms": float(values.mean()), "requests": len(values), "requests_per_s": len(values) / seconds}


def format_serve_rows(result: dict) -> list[tuple[str, str, str]]:
    """Rows (what, value, note) for launch.benchmark's table."""
    return [(f"{encoder}, {row['clients']} client{'s' if row['clients'] > 1 else ''}, upstream "
             f"{row['upstream_latency_s']:g} s", f"{row['p50_ms']:.2f} ms p50",
             f"p99 {row['p99_ms']:.2f} ms; {row['requests']} requests, {row['requests_per_s']:.0f}/s end to end")
            for encoder, rows in result.items() for row in rows.values()]
