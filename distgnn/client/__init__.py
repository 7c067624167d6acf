"""The trainer's side of the distributed store: job context, DistGraph (and its sampling view), DistTensor,
DistEmbedding, id splits. May import: errors, config, native, store, data, partition, rpc, sampling.
"""
