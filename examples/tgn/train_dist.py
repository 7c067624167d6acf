"""Temporal link prediction on an event stream with TGN and DistTGL's parallelisms.

Three ways to run it, as the other examples:

* ``--local``: the whole job on this host: ``--num-parts`` simulated machines x ``--trainers-per-machine``
  trainers (this script again, with torchrun's environment).
* no flag: one trainer of a job started by ``distgnn-launch`` or ``--local`` (RANK, WORLD_SIZE, MASTER_*).
* ``--single``: one process, one memory copy.

The stream is ``--dataset events:PATH`` (CSV or SNAP's whitespace; a header line or ``--columns
src,dst,rating,time`` names the columns, attribute columns become standardised event features) or
``synthetic-events:NODES:EVENTS``; split chronologically 70/15/15. ``--minibatch-parallelism i
--epoch-parallelism j --memory-parallelism k`` (i*j*k trainers; unset: DistTGL's heuristic, printed at start
with its reasons): i trainers split each batch, j train j epochs at once over one memory copy (an epoch then
trains every batch j times), k memory copies train their own time segments. ``--lr-scaling linear`` (default,
DistTGL's rule) multiplies ``--lr`` by the j*k batches whose gradients a step averages (``sqrt``: by its
square root; ``none``: as given); the learning rate used is printed at start. ``--evals-per-epoch N``
validates N times an epoch: the ones before its end score a scratch copy of the memory caught up to the end
of the training events with the current weights, which scores lower than the memory trained along
(docs/benchmarks-history.md).
Rank 0 prints a line per epoch and ends with ``RESULT {json}`` (the ``temporal`` keys of
:mod:`distgnn.train.result` after the shared ones): the model of the best validation-AP epoch
(best_epoch; its weights and node memory kept; ``--patience N`` stops after N epochs without a better one) with
its val_ap, test_ap, test_auc, test_mrr, the last epoch's last_val_ap, last_test_ap, and epochs_trained,
epoch_time_s, events_per_s, num_trainers, i/j/k; bad input ends in one ``error:`` line and exit code 2.
``--checkpoint-dir D --checkpoint-every N`` saves weights,
optimizer, node memory and mailbox; ``--resume auto`` continues; ``--run-dir`` writes metrics.jsonl.
"""

from __future__ import annotations

import argparse
import sys

from distgnn.temporal import job as temporal_job
from distgnn.train import job
from distgnn.train.bookkeeping import add_bookkeeping_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    temporal_job.add_temporal_args(p)
    job.add_job_args(p, epochs=5)
    add_bookkeeping_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # Bad files and bad i/j/k stop the --local job before any process starts; its trainers run alone.
    return job.main(
        __file__,
        argv,
        parse_args,
        temporal_job.check_local,
        temporal_job.run_trainer,
        kind="temporal",
        start=temporal_job.start_trainer,
    )


if __name__ == "__main__":
    sys.exit(main())
