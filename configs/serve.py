r"""The routing proxy (`launch.serve`): a trained router in front of the pool's OpenAI-compatible endpoints.

  python -m launch.serve --workdir=/tmp/rivet_mine --config=configs/serve.py

Copy this file and fill in `backends`: one entry per pool model it should route to (a pool model without one is
never a candidate; a name outside the router's pool is refused at start):

  config.backends = {
      "small": {"base_url": "http://127.0.0.1:11434/v1", "model": "qwen3:8b", "api_key_env": ""},
      "large": {"base_url": "https://api.openai.com/v1", "model": "gpt-5", "api_key_env": "OPENAI_API_KEY"},
  }

`api_key_env` names the environment variable holding the key (it must be set; "" sends no key); keys are never
written to the config, the logs or the recorded episodes.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.host = "127.0.0.1"
    config.port = 8000
    config.router_stage = ""            # the stage to serve ("": the workdir's deployed choice, else the last stage)
    config.logdir = ""                  # where the turns are recorded ("": <workdir>/serve)
    config.model_id = "rivet"           # the model name GET /v1/models lists (a request's `model` is not read)
    config.session_header = "x-rivet-session"
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
    config.backends = {}                # pool model -> {base_url, model, api_key_env} (module docstring)
    return config
