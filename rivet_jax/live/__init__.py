"""Learning from live traffic, end to end: RouteSim played as a live agent through the proxy over HTTP
(`live.routesim`) and the rounds of serve -> record -> learn -> promote it drives (`live.experiment`,
`launch.loop --config=configs/routesim_live.py`). One round on any served workdir is `rivet_jax.loop`.
"""
