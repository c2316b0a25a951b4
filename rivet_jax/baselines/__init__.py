"""Baseline routers (Sec. 5.1), each a `Policy` (rivet_jax/envs/base.py) trained on the same logged corpus.

single_turn: weighted kNN, an Avengers-Pro-style cluster router, an EmbedLLM-style matrix-factorisation router and
a RouterDC-style contrastive dual-encoder router: each chooses a model once from the task and keeps it. It re-exports
single_turn_base (the task-model table, the utility, the shared `SingleTurnRouter`), knn, cluster,
matrix_factorization and contrastive (one router each); fitting holds the training loop of the two learned ones.
mtrouter: the MTRouter-style multi-turn router: per turn, argmax of score_hat - lambda * cost_hat.
"""
