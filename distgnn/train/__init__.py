"""The training job around a model: job flags, local clusters, epoch accounting, the RESULT schema, checkpoints,
metrics, reports, evaluation, inference, the allocator setting. May import every component but temporal and snapshot.
"""
