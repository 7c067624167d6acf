"""Test selection shared by the whole suite: every test that needs a GPU carries the ``cuda`` marker, so
``pytest -m cuda`` selects the CUDA tests (as the GPU session runs them) and ``-m "not cuda"`` the rest.

A test is a CUDA test when it is marked ``cuda``, when it has a ``skipif`` whose reason says it needs CUDA or a GPU
("needs a CUDA GPU", "needs 2 CUDA GPUs", ...; skips that say the opposite, "checks the behaviour without CUDA",
do not count), or when a parameter of it is a CUDA device (``"cuda"``, ``"cuda:1"``, a ``torch.device``; such
parameters exist only where torch sees a GPU). A test that skips itself from its body (``pytest.skip``) is not
seen: mark it.

In a pytest-xdist worker (``.ci/run`` starts two) torch computes on one thread: the other worker has the other
core, and an op split over two threads waits for its slower half whenever the box is busy.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

NEEDS_GPU = re.compile(r"^needs\b.*\b(CUDA|GPUs?)\b")


def _cuda_device(value: object) -> bool:
    return str(value) == "cuda" or str(value).startswith("cuda:")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("cuda"):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(NEEDS_GPU.search(str(m.kwargs.get("reason", ""))) for m in item.iter_markers("skipif")) or any(
            _cuda_device(v) for v in params.values()
        ):
            item.add_marker(pytest.mark.cuda)
