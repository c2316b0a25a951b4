"""Environments: the `Env` / `Policy` protocols (base), RouteSim (routesim), its exact DP (oracle), and the logged
corpus collection (collect)."""
