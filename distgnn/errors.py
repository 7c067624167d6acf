"""Every exception distgnn raises on purpose.

Messages say what was expected, what came instead, and what to do about it.
"""

from __future__ import annotations


class DistGNNError(Exception):
    """Base class of every distgnn error."""


class ConfigError(DistGNNError):
    """Configuration (arguments, environment, ip_config) is missing or malformed."""


class PartitionFormatError(DistGNNError):
    """A partition on disk is missing files or breaks an invariant of the format."""


class InputError(DistGNNError):
    """Input data (a graph file, ids, feature rows) does not match what was declared."""


class RpcError(DistGNNError):
    """A remote call failed: the server answered with an error, or the reply was malformed."""


class RpcTimeoutError(RpcError):
    """A server did not answer within the call's deadline."""


class ServerLostError(RpcError):
    """The connection to a server closed, or its heartbeat stopped, while requests to it were pending."""


class ProtocolError(RpcError):
    """A message on the wire is malformed (bad header, frame count, dtype or size)."""


class AuthenticationError(RpcError):
    """A peer presented no token or a wrong one."""


class ExtensionBuildError(DistGNNError):
    """A C++ or CUDA extension could not be built or loaded."""


class CheckpointError(DistGNNError):
    """A checkpoint is missing, incomplete, tampered with, or made for another job (graph, partitions, model)."""


class SharedMemoryError(DistGNNError):
    """A shared-memory segment is missing, truncated, or does not match the manifest that lists it."""
