"""Mini-batch loaders: seeds in batches, sampled in worker processes or threads (node and edge loaders).

May import: errors, config, native, data, partition, sampling, client.
"""
