"""Temporal graphs: memory-based TGNN training (TGN) on event streams, with DistTGL's parallelisms.

The time-sorted CSR (:mod:`.graph`), the temporal sampler (:mod:`.sampler`, C++ and CUDA kernels behind one
dispatch point, numpy reference in :mod:`.reference`), the training loop and its evaluation
(:mod:`.train`), the training step on fixed shapes replayed from a CUDA graph (:mod:`.step`), DistTGL's
parallelisms (:mod:`.parallel`, :mod:`.memory_group`, :mod:`.epoch_parallel`, :mod:`.warm`), the stream and CSR
shared once per machine (:mod:`.shared`) and the job (:mod:`.job`).
May import every component but snapshot.
"""

from distgnn.temporal.graph import TemporalCSR, build_temporal_csr
from distgnn.temporal.sampler import TemporalHop, TemporalSampler

__all__ = ["TemporalCSR", "TemporalHop", "TemporalSampler", "build_temporal_csr"]
