"""Running an example's ``main`` inside the test process, for the example tests.

With ``--local`` the example's own process only starts the job's servers and trainers and relays their output,
and ``--single`` trains in that one process: run here, neither pays for a fresh interpreter importing torch.
:func:`run_example` returns the exit code, what the example printed and its ``RESULT``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch

from distgnn.train.result import read_result

ROOT = Path(__file__).resolve().parents[1]


def load_example(name: str) -> ModuleType:
    """``examples/<name>/train_dist.py`` as a module (its ``main``, ``parse_args``, ...)."""
    path = ROOT / "examples" / name / "train_dist.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class ExampleRun:
    code: int
    out: str
    err: str

    @property
    def result(self) -> dict:
        """The one ``RESULT {json}`` line's fields (asserts the run succeeded and printed exactly one)."""
        assert self.code == 0, self.err[-3000:]
        try:
            return read_result(self.out)
        except ValueError as err:
            raise AssertionError(self.out[-3000:]) from err


def run_example(name: str, argv: list[str], capsys: pytest.CaptureFixture) -> ExampleRun:
    """``main(argv)`` of example ``name``; what it and (under ``--local``) its job printed, from ``capsys``.
    The torch thread count a ``--single`` run sets is put back afterwards."""
    capsys.readouterr()  # what the test printed before is not the example's
    threads = torch.get_num_threads()
    try:
        code = load_example(name).main(list(argv))
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    return ExampleRun(code, captured.out, captured.err)
