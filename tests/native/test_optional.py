"""OptionalExtension: the module where it loads; None after exactly one warning where it cannot be built."""

from __future__ import annotations

import types
import warnings

import pytest

from distgnn.errors import ExtensionBuildError
from distgnn.native.optional import OptionalExtension


def test_a_loading_extension_is_loaded_once_and_kept() -> None:
    module, calls = types.ModuleType("kernels"), []

    def load():
        calls.append(1)
        return module

    extension = OptionalExtension("the op", load, "the reference")
    assert extension() is module and extension() is module and extension.available()
    assert len(calls) == 1


def test_a_failing_extension_warns_once_then_answers_none_until_forgotten() -> None:
    calls = []

    def fail():
        calls.append(1)
        raise ExtensionBuildError("no compiler here")

    extension = OptionalExtension("the op", fail, "the reference")
    with pytest.warns(RuntimeWarning, match="the op falls back to the reference: no compiler here"):
        assert extension() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert extension() is None and not extension.available()
    assert len(calls) == 1
    extension.forget()
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert extension() is None
    assert len(calls) == 2


def test_other_errors_of_the_loader_are_not_swallowed() -> None:
    def broken():
        raise ValueError("a bug in the loader")

    with pytest.raises(ValueError, match="a bug in the loader"):
        OptionalExtension("the op", broken, "the reference")()
