"""Serving a trained router as an OpenAI-compatible proxy that records what it serves (`launch.serve`).

`app` (the HTTP endpoints), `conversation` (a request -> the router's state and the session), `policy` (the
epsilon-greedy choice and the fallback order), `upstream` (the pool's endpoints: calls, faults, health) and
`recorder` (the write-ahead log and the episode files training reads). Nothing of the method imports this package.
"""
