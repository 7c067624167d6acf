"""The graph server: holds one partition in shared memory and answers RPC (see docs/architecture.md).

Entry point ``python -m distgnn.server``; ``server.GraphServer`` is the loop, ``handlers`` the ops,
``store`` the loading into shared memory. May import: errors, config, native, store, data, partition,
rpc, sampling.
"""
