"""The RPC layer: wire format (``wire``), authentication (``auth``) and the client (``client``).

May import: errors, config.
"""

from distgnn.rpc.client import Reply, RpcClient

__all__ = ["Reply", "RpcClient"]
