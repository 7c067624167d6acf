"""The CUDA-extension loader (distgnn.native.cuda.cuda_extension): without a GPU it says so; with one, every
extension builds."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from distgnn.errors import ExtensionBuildError
from distgnn.native import cuda


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_both_extensions_report_missing_cuda():
    assert not cuda.gather_available()
    with pytest.raises(ExtensionBuildError, match="CUDA is not available.*gather"):
        cuda.gather_kernels()
    with pytest.raises(ExtensionBuildError, match="CUDA is not available.*graph"):
        cuda.graph_kernels()


def test_missing_sources_are_named_and_the_failure_is_remembered(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(cuda, "SOURCE_DIR", tmp_path)
    (tmp_path / "present.cu").write_text("")
    with pytest.raises(ExtensionBuildError, match=r"\['absent\.cu'\] not found under") as first:
        cuda.cuda_extension("distgnn_test_missing", ("present.cu", "absent.cu"), "test")
    (tmp_path / "absent.cu").write_text("")
    with pytest.raises(ExtensionBuildError) as second:
        cuda.cuda_extension("distgnn_test_missing", ("present.cu", "absent.cu"), "test")
    assert second.value is first.value


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernels", ["gather_kernels", "graph_kernels", "nn_kernels", "temporal_kernels"])
def test_every_extension_builds_where_there_is_cuda(kernels):
    # The library falls back to torch ops when a build fails, so the kernels' own tests would pass on the fallback:
    # on a GPU machine a build failure is this test's failure, not a skip.
    assert isinstance(getattr(cuda, kernels)(), ModuleType)
