"""STAND-IN torch.cuda: one "GPU", nothing to wait for. nccl.version() names the stand-in, not an NCCL."""

from types import SimpleNamespace


def set_device(device) -> None:
    return None


def synchronize(device=None) -> None:
    return None


nccl = SimpleNamespace(version=lambda: "stand-in (no NCCL)")
