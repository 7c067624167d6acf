"""Neighbour sampling: blocks, the CPU and CUDA kernels behind one sampler, negative and edge sampling.

May import: errors, native, data, partition.
"""
