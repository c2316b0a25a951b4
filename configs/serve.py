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

from rivet_jax import settings


def get_config() -> ml_collections.ConfigDict:
    # Every key, its default and what it means: rivet_jax/settings.py (SERVE_SETTINGS).
    return settings.config_of(settings.SERVE_SETTINGS)
