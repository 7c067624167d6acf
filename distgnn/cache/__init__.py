"""distgnn.cache: the GPU feature path — hot-set choice, the tiered FeatureCache and the one-launch gather.

Importing this package needs torch only (no zmq, no pymetis); the CUDA extension builds on first use.
May import: errors, config, native, data, partition, sampling, client, loader.
"""

from distgnn.cache.feature_cache import CacheStats, FeatureCache
from distgnn.cache.gather import gather, remote_misses
from distgnn.cache.host_memory import HostRegistration
from distgnn.cache.hot_set import access_frequency, choose_hot_set
from distgnn.cache.ipc import clique_over_processes, export_shard, open_shard
from distgnn.cache.tiers import HostTier, StagingTier
from distgnn.native.cuda import gather_available

__all__ = [
    "CacheStats",
    "FeatureCache",
    "HostRegistration",
    "HostTier",
    "StagingTier",
    "access_frequency",
    "choose_hot_set",
    "clique_over_processes",
    "export_shard",
    "gather_available",
    "gather",
    "open_shard",
    "remote_misses",
]
