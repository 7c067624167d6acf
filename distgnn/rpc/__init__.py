"""The RPC layer: wire format (``wire``), authentication (``auth``) and the client (``client``)."""

from distgnn.rpc.client import Reply, RpcClient

__all__ = ["Reply", "RpcClient"]
