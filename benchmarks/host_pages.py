"""Zero-copy reads of scattered rows from host memory: does the GPU's page size for host memory matter?

Zero-copy gathers of a batch's scattered feature rows stall at ~27 GB/s while dense rows stream at the
copy ceiling (docs/benchmarks-history.md, "GPU gather": the rate falls once rows lie more than ~16-32 KB apart,
with 4 KB and 2 MB host pages alike). If the GPU maps page-locked host memory with small pages, every
scattered row costs a GPU TLB miss. The CUDA driver's virtual memory API can allocate host memory
(``cuMemCreate`` with a host location) in 2 MB granules and map it into the GPU's address space; this
script compares zero-copy reads from such an allocation with reads from ``cudaHostAlloc`` memory (torch's
pinned memory), same rows, same kernel (``distgnn.cache.gather`` with the table as its host tier).

    python3 benchmarks/host_pages.py [--num-nodes 24000000] [--dim 128] [--rows 213000]

Rows read: ``--rows`` distinct ids, sorted, drawn uniformly (a GraphSAGE batch's misses are ~0.9% of a
12 GB table, ~58 KB apart; the gather sorts them), and the same count of consecutive ids (dense control).
GB/s = rows x row bytes / median time of ``--repeats`` whole gather calls.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch

from distgnn.cache.gather import gather
from distgnn.cache.tiers import HostTier

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_LOCATION_TYPE_HOST = 2
CU_MEM_LOCATION_TYPE_HOST_NUMA = 3
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class AllocationProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", MemLocation),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


class DriverError(RuntimeError):
    pass


class HostVmm:
    """``nbytes`` of host memory from ``cuMemCreate`` (location ``location_type``), mapped for ``device``."""

    def __init__(self, nbytes: int, device: int, location_type: int) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        prop = AllocationProp()
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = MemLocation(location_type, 0)
        granularity = ctypes.c_size_t()
        self._check(
            "cuMemGetAllocationGranularity",
            ctypes.byref(granularity),
            ctypes.byref(prop),
            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
        self.granularity = granularity.value
        self.size = -(-nbytes // self.granularity) * self.granularity
        self.handle = ctypes.c_ulonglong()
        self._check(
            "cuMemCreate",
            ctypes.byref(self.handle),
            ctypes.c_size_t(self.size),
            ctypes.byref(prop),
            ctypes.c_ulonglong(0),
        )
        self.ptr = ctypes.c_ulonglong()
        self._check(
            "cuMemAddressReserve",
            ctypes.byref(self.ptr),
            ctypes.c_size_t(self.size),
            ctypes.c_size_t(self.granularity),
            ctypes.c_ulonglong(0),
            ctypes.c_ulonglong(0),
        )
        self._check(
            "cuMemMap", self.ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle, ctypes.c_ulonglong(0)
        )
        access = (AccessDesc * 2)()
        access[0] = AccessDesc(MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, device), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        # CPU access: named by the allocation's own location type (the driver refuses others for host memory).
        access[1] = AccessDesc(MemLocation(location_type, 0), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        self.host_access = True
        try:
            self._check("cuMemSetAccess", self.ptr, ctypes.c_size_t(self.size), access, ctypes.c_size_t(2))
        except DriverError:
            self.host_access = False
            self._check("cuMemSetAccess", self.ptr, ctypes.c_size_t(self.size), access, ctypes.c_size_t(1))

    def _check(self, name: str, *args) -> None:
        result = getattr(self.cuda, name)(*args)
        if result != 0:
            text = ctypes.c_char_p()
            self.cuda.cuGetErrorString(result, ctypes.byref(text))
            raise DriverError(f"{name} failed: {result} {text.value.decode() if text.value else ''}")

    def copy_from(self, src: int, nbytes: int) -> None:
        """Copies ``nbytes`` from the (pinned) host address ``src`` into the allocation, 1 GB per call."""
        step = 1 << 30
        for offset in range(0, nbytes, step):
            size = min(step, nbytes - offset)
            self._check("cuMemcpy", ctypes.c_ulonglong(self.ptr.value + offset), ctypes.c_ulonglong(src + offset),
                        ctypes.c_size_t(size))  # fmt: skip
        self._check("cuCtxSynchronize")

    def memory_type(self) -> str:
        """What ``cuPointerGetAttribute`` says the mapping is (host or device memory)."""
        kind = ctypes.c_uint()
        self._check("cuPointerGetAttribute", ctypes.byref(kind), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, self.ptr)
        return {1: "host", 2: "device", 3: "array", 4: "unified"}.get(kind.value, str(kind.value))

    def close(self) -> None:
        self._check("cuMemUnmap", self.ptr, ctypes.c_size_t(self.size))
        self._check("cuMemAddressFree", self.ptr, ctypes.c_size_t(self.size))
        self._check("cuMemRelease", self.handle)


def host_view(ptr: int, shape: tuple[int, int]) -> torch.Tensor:
    """A CPU float32 tensor over ``ptr`` (no read happens here): the gather kernel only takes its address."""
    buffer = (ctypes.c_float * (shape[0] * shape[1])).from_address(ptr)
    return torch.frombuffer(buffer, dtype=torch.float32).view(shape)


def fill_pinned(table: torch.Tensor, device: torch.device, seed: int) -> None:
    """Pseudo-random rows made on the GPU and copied in, 256 MB at a time."""
    generator = torch.Generator(device=device).manual_seed(seed)
    step = max(1, (256 << 20) // (table.shape[1] * 4))
    for start in range(0, table.shape[0], step):
        rows = table[start : start + step]
        rows.copy_(torch.randn(rows.shape, generator=generator, device=device))


def time_gather(out: torch.Tensor, ids: torch.Tensor, host: HostTier, repeats: int) -> float:
    """Median seconds of one whole ``gather`` call (plan + kernel + its one sync)."""
    for _ in range(3):
        gather(out, ids, host=host, impl="cuda")
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        gather(out, ids, host=host, impl="cuda")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-nodes", type=int, default=24_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--rows", type=int, default=213_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=device)  # the primary context, current on this thread for the driver calls
    shape = (args.num_nodes, args.dim)
    nbytes = args.num_nodes * args.dim * 4
    print(
        f"device {torch.cuda.get_device_name(device)}; table {shape[0]:,} x {shape[1]} float32 = {nbytes / 1e9:.1f} GB"
    )

    start = time.perf_counter()
    pinned = torch.empty(shape, dtype=torch.float32, pin_memory=True)
    fill_pinned(pinned, device, seed=1)
    print(f"cudaHostAlloc table filled in {time.perf_counter() - start:.1f} s")
    tables = {"cudaHostAlloc (torch pinned)": pinned}
    owners = []
    for label, location in (("cuMemCreate host", CU_MEM_LOCATION_TYPE_HOST),
                            ("cuMemCreate host NUMA 0", CU_MEM_LOCATION_TYPE_HOST_NUMA)):  # fmt: skip
        try:
            start = time.perf_counter()
            vmm = HostVmm(nbytes, device.index, location)
            vmm.copy_from(pinned.data_ptr(), nbytes)
        except (DriverError, OSError, AttributeError) as exc:
            print(f"{label}: not available ({exc})")
            continue
        owners.append(vmm)
        print(
            f"{label}: granularity {vmm.granularity >> 10} KB, CPU access {vmm.host_access}, "
            f"pointer type {vmm.memory_type()}, allocated and copied in {time.perf_counter() - start:.1f} s"
        )
        tables[label] = host_view(vmm.ptr.value, shape)

    generator = torch.Generator(device=device).manual_seed(0)
    scattered = torch.randperm(args.num_nodes, generator=generator, device=device)[: args.rows]
    dense = torch.arange(args.num_nodes // 2, args.num_nodes // 2 + args.rows, device=device)
    out = torch.empty((args.rows, args.dim), dtype=torch.float32, device=device)
    check = scattered[:1000].cpu()
    print(f"| {'host memory':30} | {'rows read':9} | {'GB/s':>6} | {'ms':>6} |")
    print(f"|{'-' * 32}|{'-' * 11}|-------:|-------:|")
    for label, table in tables.items():
        host = HostTier(table, 0)
        for kind, ids in (("scattered", scattered), ("dense", dense)):
            out.fill_(float("nan"))
            seconds = time_gather(out, ids, host, args.repeats)
            if kind == "scattered":
                assert torch.equal(out[:1000].cpu(), pinned[check]), f"{label}: gathered rows differ from the table's"
            print(f"| {label:30} | {kind:9} | {args.rows * args.dim * 4 / seconds / 1e9:6.1f} | {seconds * 1e3:6.2f} |")
    del tables
    for vmm in owners:
        vmm.close()


if __name__ == "__main__":
    main()
