"""Where a job's data rests between processes: POSIX shared-memory segments and checkpoint files on disk.

Written by servers, read by trainers (and the other way round for checkpoints). May import: errors.
"""
