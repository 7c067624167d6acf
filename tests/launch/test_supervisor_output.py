"""How the supervisor passes a process's output on: labelled lines (``distgnn-launch``), or as it comes (the
examples' ``--local`` runs), a progress bar redrawn after ``\\r`` shown before its line ends."""

from __future__ import annotations

import io
import threading

from distgnn.launch import env as E
from distgnn.launch.plan import ProcessSpec
from distgnn.launch.remote import EXIT_REPORT
from distgnn.launch.supervisor import Job, Running


class Sink(io.StringIO):
    """Records what had been written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


class Pipe(io.RawIOBase):
    """A pipe read in the pieces it was written in (a process writing a progress bar bit by bit)."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not self.pieces:
            return 0
        piece = self.pieces.pop(0)
        buffer[: len(piece)] = piece
        return len(piece)


def pump(labelled: bool, pieces: list[bytes]) -> tuple[Sink, Job, Running]:
    spec = ProcessSpec(0, "127.0.0.1", "trainer", 1, ("python",), {E.JOB_ID: "j1"}, agent=False)
    err = Sink()
    job = Job([spec], None, "python", "t", 1, err=err, labelled=labelled, name="" if not labelled else "x")
    proc = Running(spec, None)
    reader = threading.Thread(target=job._pump, args=(proc, io.BufferedReader(Pipe(pieces)), err))
    reader.start()
    reader.join(10)
    return err, job, proc


PIECES = [
    b"epoch 0:  10%\r",
    b"epoch 0:  60%\r",
    b"epoch 0: 100%\r\nloss 0.5\n",
    EXIT_REPORT.encode() + b'{"pid": 7}\n',
]


def test_unlabelled_output_shows_a_progress_bar_as_it_is_drawn():
    err, job, proc = pump(False, PIECES)
    assert err.getvalue() == "epoch 0:  10%\repoch 0:  60%\repoch 0: 100%\nloss 0.5\n"
    assert "epoch 0:  10%\r" in err.flushed  # shown before its line ended
    assert proc.exit_report == {"pid": 7} and job.last_stderr["0/trainer/1"] == "loss 0.5"
    assert list(job.tails["0/trainer/1"]) == ["epoch 0:  10%\repoch 0:  60%\repoch 0: 100%", "loss 0.5"]


def test_labelled_output_comes_in_whole_lines():
    err, _, proc = pump(True, PIECES)
    assert err.getvalue() == "[0/trainer/1] epoch 0:  10%\repoch 0:  60%\repoch 0: 100%\n[0/trainer/1] loss 0.5\n"
    assert proc.exit_report == {"pid": 7}
