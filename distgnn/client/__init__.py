"""The trainer's side of the distributed store: job context, DistGraph, DistTensor, DistEmbedding, id splits.

May import: errors, config, native, store, data, partition, rpc.
"""
