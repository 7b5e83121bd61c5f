"""STAND-IN for PyTorch inside the stand-in vLLM image (tests only; there is no GPU, NCCL or torch here).

It carries exactly what the fabric's bandwidth test (roles/spark_fabric/files/allreduce_bench.py) asks of torch,
with the same names and call shapes: torch.device, torch.ones(count, dtype=, device=) and a tensor's fill_, `!=`,
.sum().item(); torch.cuda.set_device, synchronize, nccl.version(); torch.distributed (distributed.py). A tensor
holds one value for all its elements (the test fills it uniformly) and its size in bytes; the data that crosses the
network is real: every all-reduce moves the tensor's bytes between the ranks over TCP (distributed.py), so the
bandwidth the script reports is the simulated fabric's own. The real torch runs the same script in
tests/unit/test_nccl_bandwidth.py (gloo), which holds this stand-in to its calls.
"""

from __future__ import annotations

from types import SimpleNamespace

from . import cuda, distributed  # noqa: F401  (torch.distributed, torch.cuda as attributes, as in torch)

__version__ = "0.0.0+sparkfleet.standin"
float32 = SimpleNamespace(itemsize=4, name="float32")


class device:  # torch's own (lower-case) name
    def __init__(self, kind: str, index: int | None = None) -> None:
        self.type, self.index = kind, index


class Tensor:
    def __init__(self, count: int, value: float, dtype=float32, device=None) -> None:
        self.count, self.value, self.dtype, self.device = count, float(value), dtype, device

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    def fill_(self, value: float) -> Tensor:
        self.value = float(value)
        return self

    def __ne__(self, other: object) -> _Count:  # type: ignore[override]
        return _Count(self.count if self.value != other else 0)


class _Count:
    def __init__(self, number: int) -> None:
        self.number = number

    def sum(self) -> _Count:
        return self

    def item(self) -> int:
        return self.number


def ones(count: int, dtype=float32, device=None) -> Tensor:
    return Tensor(count, 1.0, dtype, device)
