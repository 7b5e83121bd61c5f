"""A stand-in /sys/class/net for the fabric tests: the ports of a Spark's ConnectX-7 with their RDMA devices."""

from __future__ import annotations

from pathlib import Path

VETH_SPEED = 10000  # what the kernel reports for a veth link, in Mb/s


def fake_sysfs(root: Path, rdma_by_interface: dict[str, str], speed: int = VETH_SPEED, mtu: int = 9000) -> Path:
    """A /sys/class/net with one up port per interface, each with its RDMA device behind it, as on a Spark."""
    for interface, rdma in rdma_by_interface.items():
        port = root / interface
        (port / "device" / "infiniband" / rdma).mkdir(parents=True)
        for name, value in {"operstate": "up", "carrier": "1", "speed": str(speed), "mtu": str(mtu)}.items():
            (port / name).write_text(value + "\n", encoding="ascii")
    return root
