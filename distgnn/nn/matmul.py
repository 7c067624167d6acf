"""The layers' dense products, decided in one place: float32, or bfloat16 on a CPU's matrix units.

:func:`linear` is ``x @ weight.T + bias`` for the GNN layers. Which kernel computes it follows torch's
``torch.set_float32_matmul_precision`` (the examples' ``--matmul-precision``):

* ``highest`` / ``high``: torch's float32 product (``high`` is TF32 on a GPU; on a CPU torch keeps float32);
* ``medium`` on a CPU with AMX tiles: the inputs rounded to bfloat16, the product on the AMX units with float32
  accumulation, its result rounded to bfloat16 and returned as float32 (what CPU autocast gives a product,
  without casting anything else of the model), and the same for both products of the backward. At the first
  layer of a 1M-node GraphSAGE batch (56k x 200 x 256, one thread) both are faster, the casts included
  (``python benchmarks/matmul_cpu.py``); the relative error of a product is ~3e-3. A whole 1M-node GraphSAGE
  epoch on the 2-core development box did not gain (docs/benchmarks-history.md), so it is opt-in.
* ``medium`` elsewhere: torch's float32 product (a CPU without AMX gains nothing from bfloat16 inputs; on a GPU
  torch's ``medium`` applies).
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def cpu_has_matrix_units() -> bool:
    """Whether this CPU has AMX tiles that this process may use (torch's check, which also asks the kernel for
    the tile state), where bfloat16 products pay."""
    for name in ("_is_amx_tile_supported", "_init_amx"):  # the first in older torch, the second in newer
        check = getattr(torch._C._cpu, name, None)
        if check is not None:
            return bool(check())
    return False


def bf16_on_cpu(x: torch.Tensor) -> bool:
    """Whether :func:`linear` of ``x`` takes the bfloat16 path (precision ``medium``, a CPU tensor, AMX)."""
    return x.device.type == "cpu" and torch.get_float32_matmul_precision() == "medium" and cpu_has_matrix_units()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: ``x`` [n, in], ``weight`` [out, in], ``bias`` [out], [n, out] or None -> [n, out]
    float32."""
    if bf16_on_cpu(x):
        return _BF16Linear.apply(x, weight, bias)
    if bias is None:
        return x @ weight.t()
    return torch.addmm(bias, x, weight.t())


class _BF16Linear(torch.autograd.Function):
    """:func:`linear` with bfloat16 inputs and float32 results; the backward's two products likewise (the
    saved inputs are the bfloat16 copies, half the bytes of float32 ones)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x16, w16 = x.to(torch.bfloat16), weight.to(torch.bfloat16)
        ctx.save_for_backward(x16, w16)
        ctx.bias_dim = None if bias is None else bias.dim()
        out = (x16 @ w16.t()).float()
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x16, w16 = ctx.saved_tensors
        grad16 = grad.to(torch.bfloat16)
        grad_x = (grad16 @ w16).float() if ctx.needs_input_grad[0] else None
        grad_w = (grad16.t() @ x16).float() if ctx.needs_input_grad[1] else None
        grad_b = None
        if ctx.bias_dim is not None and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0) if ctx.bias_dim == 1 else grad
        return grad_x, grad_w, grad_b
