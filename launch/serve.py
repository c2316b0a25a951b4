r"""Serves a trained router as an OpenAI-compatible proxy that routes every turn and records it for retraining.

  python -m launch.serve --workdir=/tmp/rivet_mine --config=my_serve.py      # a copy of configs/serve.py

Point an agent's OpenAI client at http://HOST:PORT/v1 (any model name); close each episode with
POST /v1/episodes/<session>/outcome {"outcome": y}. The recorded <logdir>/episodes.jsonl trains as it is:
python -m launch.train --config.data.episodes=<logdir>/episodes.jsonl --config.data.cards=... (docs/serve.md).
"""

import os

from absl import flags, logging
from ml_collections import config_flags

from launch.common import quiet_http_clients, run_app, run_reporting_user_errors
from rivet_jax.config_checks import ConfigError
from rivet_jax.router import Router

_CONFIG = config_flags.DEFINE_config_file("config", "configs/serve.py", "Serve config (configs/serve.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "The trained router's workdir (launch.train's).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
    del argv
    from rivet_jax.serve.app import serve  # deferred: --help need not load the web stack
    from rivet_jax.serve.proxy import Proxy
    from rivet_jax.serve.recorder import Recorder
    from rivet_jax.serve.upstream import backends_from_config

    config = _CONFIG.value
    quiet_http_clients()   # a line per upstream call; every served turn is recorded, faults still logged

    def start():
        if config.auth_token_env and not os.environ.get(config.auth_token_env):
            raise ConfigError(f"config.auth_token_env names {config.auth_token_env}, which is not set (or empty): set "
                              f"it to the token clients must send")
        if not config.auth_token_env and config.host not in ("127.0.0.1", "localhost", "::1"):
            logging.warning("serving on %s without a token: anyone who reaches it spends the upstream keys; set "
                            "config.auth_token_env (docs/serve.md)", config.host)
        router = Router.from_checkpoint(_WORKDIR.value, stage=config.router_stage or None)
        lam = router.lam if config.lam is None else float(config.lam)
        try:
            router.at_lambda(lam)
        except ValueError as error:
            raise ConfigError(f"config.lam: {error}") from None
        logging.info("lambda-conditioned router: each request routes at its x-rivet-lambda header, default %g"
                     if router.lambda_conditioned else "fixed-lambda router: every request routes at lambda %g "
                     "(an x-rivet-lambda header may only repeat it)", lam)
        given = config.backends.to_dict() if hasattr(config.backends, "to_dict") else config.backends
        backends = backends_from_config(given, router.pool)  # a ConfigError: one line
        unserved = [name for name in router.pool.names if name not in backends]
        if unserved:
            logging.warning("pool models without a backend, never candidates: %s", ", ".join(unserved))
        logdir = config.logdir or os.path.join(_WORKDIR.value, "serve")
        proxy = Proxy(router, backends, Recorder(logdir, router.pool), config, workdir=_WORKDIR.value)
        logging.info("routing %s on http://%s:%d/v1 (router: %d member(s), encoder %s); recording to %s",
                     ", ".join(backends), config.host, config.port, router.members, router.encoder.fingerprint,
                     logdir)
        serve(proxy)

    run_reporting_user_errors(start, config)


if __name__ == "__main__":
    run_app(main)
