r"""The routing proxy (`launch.serve`): a trained router in front of the pool's OpenAI-compatible endpoints.

  python -m launch.serve --workdir=/tmp/rivet_mine --config=configs/serve.py

Copy this file and fill in `backends`: one entry per pool model it should route to (a pool model without one is
never a candidate; a name outside the router's pool is refused at start):

  config.backends = {
      "small": {"base_url": "http://127.0.0.1:11434/v1", "model": "qwen3:8b", "api_key_env": ""},
      "large": {"base_url": "https://api.openai.com/v1", "model": "gpt-5", "api_key_env": "OPENAI_API_KEY"},
  }

Any model name works, dots included (`gpt-3.5-turbo-0613`, `Qwen1.5-72B-Chat`): `backends` is a plain dict, not a
nested config (whose keys cannot hold dots).

`api_key_env` names the environment variable holding the key (it must be set; "" sends no key); keys are never
written to the config, the logs or the recorded episodes.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.host = "127.0.0.1"
    config.port = 8000
    config.router_stage = ""            # the stage to serve ("": the workdir's deployed choice, else the last stage)
    config.logdir = ""                  # where the turns are recorded ("": <workdir>/serve)
    config.model_id = "rivet"           # the model name GET /v1/models lists (a request's `model` is not read)
    config.session_header = "x-rivet-session"
    config.task_family = ""             # recorded episodes' task family, unless a request's x-rivet-task-family says
    config.epsilon = 0.0                # per-turn exploration: a uniformly random candidate with this probability
    config.seed = 0                     # of the exploration draws
    # Where Q_route is computed: "auto" (on the event loop for the hashing encoder, whose ~1 ms holds the GIL
    # anyway; in a thread for the neural encoders, so that their tens of ms do not stall other requests), or
    # "inline" / "thread".
    config.scoring = "auto"
    config.max_attempts = 3             # candidates tried per request before answering 502
    config.timeout_s = 120.0            # an upstream call's read timeout (a hang is a fault)
    config.connect_timeout_s = 5.0
    config.cooloff_s = 30.0             # a backend that faulted is not a candidate for this long
    config.episode_timeout_s = 3600.0   # an open episode idle this long closes with outcome unknown (kept apart)
    # pool model -> {base_url, model, api_key_env} (module docstring); kept a plain dict (a placeholder of any type)
    config.backends = config_dict.placeholder(object)
    # Who may call it (rivet_jax/serve/app.py). Bound beyond loopback (host 0.0.0.0), set auth_token_env: the
    # variable holding a token that chat, outcome and model requests must carry as "Authorization: Bearer <token>"
    # (the proxy spends the upstream keys of whoever reaches it). Browsers' cross-site requests are refused unless
    # their Origin is listed.
    config.auth_token_env = ""          # "" = no token asked (loopback use)
    config.allowed_origins = ()         # e.g. ("https://my-app.example",); requests without an Origin are not browsers'
    config.max_body_bytes = 8 << 20     # a request body over this is answered 413
    return config
