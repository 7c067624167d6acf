"""Extensions a caller can do without: :class:`OptionalExtension` loads one on first use and, where it cannot be
built, warns once and answers None from then on, so the caller runs its fallback (torch ops, numpy reference).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from types import ModuleType

from distgnn.errors import ExtensionBuildError


class OptionalExtension:
    """``extension()``: the module ``loader()`` returns, or None after one RuntimeWarning where it raised
    :class:`~distgnn.errors.ExtensionBuildError`; either answer is kept.

    Args:
        what: what runs in the extension, for the warning (``"CUDA relu_dropout"``).
        loader: builds or loads the extension; called once (again only after :meth:`forget`).
        fallback: what runs instead, for the warning (``"torch ops"``).
    """

    def __init__(self, what: str, loader: Callable[[], ModuleType], fallback: str):
        self.what = what
        self.fallback = fallback
        self._loader = loader
        self._lock = threading.Lock()
        self._loaded = False
        self._module: ModuleType | None = None

    def __call__(self) -> ModuleType | None:
        if self._loaded:
            return self._module
        with self._lock:
            if not self._loaded:
                try:
                    self._module = self._loader()
                except ExtensionBuildError as exc:
                    warnings.warn(f"{self.what} falls back to {self.fallback}: {exc}", RuntimeWarning, stacklevel=3)
                    self._module = None
                self._loaded = True
        return self._module

    def available(self) -> bool:
        """Whether the extension loads (building it now where it was not tried yet)."""
        return self() is not None

    def forget(self) -> None:
        """Try the loader again on the next call (tests that make it fail)."""
        with self._lock:
            self._loaded, self._module = False, None
