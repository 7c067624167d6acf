"""Page-locking existing host memory (``cudaHostRegister``) so a GPU kernel reads it zero-copy.

The local partition's feature rows live in a ``/dev/shm`` mapping shared by the machine's servers and
trainers; registering that mapping lets the gather kernel read its rows over PCIe without a staging copy.
"""

from __future__ import annotations

import torch

from distgnn.errors import InputError
from distgnn.native.cuda import gather_kernels


class HostRegistration:
    """Registers a CPU tensor's memory with CUDA for as long as this object is open.

    Use as a context manager or call :meth:`close`; the tensor must outlive the registration. Whole pages
    around the tensor are registered, so two registrations must not share a page.

    Args:
        tensor: a contiguous CPU tensor (for instance ``torch.from_numpy`` of a ``/dev/shm`` memmap).
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise InputError(f"only contiguous CPU tensors can be registered, got one on {tensor.device}")
        self.tensor = tensor
        self._base: int | None = None
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes:
            self._base = gather_kernels().host_register(tensor.data_ptr(), nbytes)

    @property
    def registered(self) -> bool:
        return self._base is not None

    def close(self) -> None:
        """Unregisters the memory; safe to call twice."""
        if self._base is not None:
            base, self._base = self._base, None
            gather_kernels().host_unregister(base)

    def __enter__(self) -> HostRegistration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
