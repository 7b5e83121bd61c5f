"""STAND-IN torch.distributed: the env:// rendezvous and an all-reduce over real TCP sockets.

Like torch's env:// init: rank 0 listens on MASTER_ADDR:MASTER_PORT (an address not its own fails at once), the
others connect to it until the timeout, each introducing itself with its rank; WORLD_SIZE ranks in all. An
all-reduce sends each worker's tensor bytes (and its value) to rank 0, which sums the values and sends the bytes
back: the bytes cross the simulated fabric for real, so the time measured is the network's. barrier() is an
all-reduce of nothing.
"""

from __future__ import annotations

import os
import socket
import struct
import time

_state: dict = {}
_HEADER = struct.Struct("!dQ")  # value, bytes that follow


def _receive(connection: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            raise RuntimeError("stand-in torch.distributed: a rank went away")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def init_process_group(backend: str, timeout=None) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + (timeout.total_seconds() if timeout else 1800)
    peers: list[socket.socket] = []
    if rank == 0:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address, port))
        server.listen(world)
        server.settimeout(max(1.0, deadline - time.monotonic()))
        while len(peers) < world - 1:
            connection, _ = server.accept()
            _receive(connection, 8)
            peers.append(connection)
        server.close()
    else:
        while True:
            try:
                connection = socket.create_connection((address, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        connection.settimeout(None)
        connection.sendall(struct.pack("!Q", rank))
        peers.append(connection)
    _state.update(rank=rank, world=world, peers=peers, backend=backend)


def all_reduce(tensor) -> None:
    payload = b"\0" * tensor.nbytes
    if _state["rank"] == 0:
        total = tensor.value
        for peer in _state["peers"]:
            value, size = _HEADER.unpack(_receive(peer, _HEADER.size))
            _receive(peer, size)
            total += value
        for peer in _state["peers"]:
            peer.sendall(_HEADER.pack(total, len(payload)) + payload)
        tensor.value = total
    else:
        (peer,) = _state["peers"]
        peer.sendall(_HEADER.pack(tensor.value, len(payload)) + payload)
        value, size = _HEADER.unpack(_receive(peer, _HEADER.size))
        _receive(peer, size)
        tensor.value = value


def barrier() -> None:
    from . import Tensor

    all_reduce(Tensor(0, 0.0))


def destroy_process_group() -> None:
    for peer in _state.pop("peers", []):
        peer.close()
