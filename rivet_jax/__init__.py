"""rivet_jax: cost-aware per-turn LLM routers learned offline from logged multi-turn trajectories (RIVET).

What a user holds:

    rivet_jax.fit(config, workdir)            logs -> runs -> the validated choice (deploy.json) and its verdict
    rivet_jax.Router.from_checkpoint(workdir) the deployed router: route(task, history, available) -> a model

Both load on first use, so `import rivet_jax.data.schema` (a converter, the proxy) does not pull in the trainer.
"""

__all__ = ["fit", "Router"]


def __getattr__(name: str):
    if name == "fit":
        from rivet_jax.pipeline import fit

        return fit
    if name == "Router":
        from rivet_jax.router import Router

        return Router
    raise AttributeError(f"module 'rivet_jax' has no attribute {name!r}")
