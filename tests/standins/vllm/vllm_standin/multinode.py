"""vLLM's native multi-node mode (``--nnodes N``, no Ray), as far as deployment code can observe it.

Real vLLM: every node runs ``vllm serve M --tensor-parallel-size T --nnodes N --node-rank R --master-addr A
--master-port P``; rank 0 (the head) hosts torch.distributed's store on A:P and serves the API; the others run
``--headless``. The head's API server starts only after every rank has joined and the weights are loaded, and
when a rank dies the collective fails and the engine (so the whole server) exits.

The stand-in keeps those rules with one TCP connection per worker:
- the head binds A:P itself, so a master address that is not one of the head's own addresses fails at once
  ("Cannot assign requested address"), as torch's store does;
- a worker connects from ``$VLLM_HOST_IP`` when it is set (vLLM pins its sockets to that address), retrying
  until ``VLLM_STANDIN_JOIN_TIMEOUT`` seconds (default 600) have passed, and introduces itself with one JSON
  line: rank, nnodes, tensor-parallel size, model and revision;
- the head refuses a worker whose settings differ from its own, naming the difference, and logs each join
  with the address it came from;
- either side exits 1 when the other goes away.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MASTER_ADDR = "127.0.0.1"  # vLLM's ParallelConfig default
DEFAULT_MASTER_PORT = 29501


@dataclass(frozen=True)
class Topology:
    """This node's place in a multi-node deployment."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    tensor_parallel_size: int
    host_ip: str  # $VLLM_HOST_IP, "" when unset

    def hello(self, model: str, revision: str | None) -> dict[str, object]:
        return {
            "rank": self.node_rank,
            "nnodes": self.nnodes,
            "tensor_parallel_size": self.tensor_parallel_size,
            "model": model,
            "revision": revision,
        }


def topology_from(values: dict[str, object]) -> Topology | None:
    """The multi-node settings of a parsed command line, or None for a single node."""
    nnodes = int(values.get("nnodes") or 1)
    if nnodes <= 1:
        return None
    rank = int(values.get("node_rank") or 0)
    if not 0 <= rank < nnodes:
        raise ValueError(f"--node-rank {rank} is out of range for --nnodes {nnodes}")
    return Topology(
        nnodes=nnodes,
        node_rank=rank,
        master_addr=str(values.get("master_addr") or DEFAULT_MASTER_ADDR),
        master_port=int(values.get("master_port") or DEFAULT_MASTER_PORT),
        tensor_parallel_size=int(values.get("tensor_parallel_size") or 1),
        host_ip=os.environ.get("VLLM_HOST_IP", ""),
    )


def join_timeout() -> float:
    return float(os.environ.get("VLLM_STANDIN_JOIN_TIMEOUT", "600"))


def _send_line(conn: socket.socket, body: dict[str, object]) -> None:
    conn.sendall(json.dumps(body).encode() + b"\n")


def _read_line(conn: socket.socket) -> dict[str, object]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("the peer closed the connection during the handshake")
        data += chunk
    return json.loads(data)


def watch_connection(conn: socket.socket, on_lost: Callable[[], None]) -> None:
    """Call on_lost once the peer's end of conn closes (a thread per connection, as NCCL's watchdog)."""

    def run() -> None:
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        on_lost()

    threading.Thread(target=run, name="peer-watch", daemon=True).start()


class Head:
    """Rank 0: hosts the rendezvous and waits for every other rank."""

    def __init__(self, topology: Topology, model: str, revision: str | None) -> None:
        self.topology = topology
        self.expected = topology.hello(model, revision)
        family = socket.AF_INET6 if ":" in topology.master_addr else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.workers: list[socket.socket] = []

    def bind(self) -> None:
        """Raises OSError when the master address is not this host's (as torch's TCPStore would)."""
        self.listener.bind((self.topology.master_addr, self.topology.master_port))
        self.listener.listen(self.topology.nnodes)
        self.listener.settimeout(0.5)

    def wait_for_workers(self, stop: threading.Event, log: Callable[[str, str], None]) -> bool:
        """Accept nnodes-1 valid workers; False when stopped or timed out (the reason is logged)."""
        deadline = time.monotonic() + join_timeout()
        joined: set[int] = set()
        while len(joined) < self.topology.nnodes - 1:
            if stop.is_set():
                return False
            if time.monotonic() > deadline:
                log(
                    "ERROR",
                    f"timed out after {join_timeout():g} s waiting for node ranks "
                    f"{sorted(set(range(1, self.topology.nnodes)) - joined)} to join",
                )
                return False
            try:
                conn, address = self.listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            try:
                hello = _read_line(conn)
            except (OSError, ValueError) as error:
                log("WARNING", f"dropped a connection from {address[0]}: {error}")
                conn.close()
                continue
            problem = self._mismatch(hello, joined)
            if problem:
                log("ERROR", f"node from {address[0]} refused: {problem}")
                _send_line(conn, {"error": problem})
                conn.close()
                continue
            _send_line(conn, {"ok": True})
            conn.settimeout(None)
            joined.add(int(hello["rank"]))
            self.workers.append(conn)
            log("INFO", f"node rank {hello['rank']} joined from {address[0]}")
        return True

    def _mismatch(self, hello: dict[str, object], joined: set[int]) -> str:
        for key in ("nnodes", "tensor_parallel_size", "model", "revision"):
            if hello.get(key) != self.expected[key]:
                return f"its {key} is {hello.get(key)!r}, the head's is {self.expected[key]!r}"
        rank = hello.get("rank")
        if not isinstance(rank, int) or not 1 <= rank < self.topology.nnodes or rank in joined:
            return f"node rank {rank!r} is not a free worker rank of {self.topology.nnodes} nodes"
        return ""

    def watch(self, on_lost: Callable[[], None]) -> None:
        for conn in self.workers:
            watch_connection(conn, on_lost)

    def close(self) -> None:
        for conn in self.workers:
            conn.close()
        self.listener.close()


def join_head(
    topology: Topology, model: str, revision: str | None, stop: threading.Event, log: Callable[[str, str], None]
) -> socket.socket | None:
    """A worker's connection to the head, retried until the join timeout; None when stopped or refused."""
    deadline = time.monotonic() + join_timeout()
    target = (topology.master_addr, topology.master_port)
    last_error = ""
    while not stop.is_set():
        try:
            source = (topology.host_ip, 0) if topology.host_ip else None
            conn = socket.create_connection(target, timeout=5, source_address=source)
            _send_line(conn, topology.hello(model, revision))
            reply = _read_line(conn)
        except (OSError, ValueError) as error:
            if last_error != str(error):
                log("INFO", f"waiting for the head at {target[0]}:{target[1]}: {error}")
                last_error = str(error)
            if time.monotonic() > deadline:
                log("ERROR", f"timed out after {join_timeout():g} s joining the head at {target[0]}:{target[1]}")
                return None
            stop.wait(1)
            continue
        if "error" in reply:
            log("ERROR", f"the head refused this node: {reply['error']}")
            conn.close()
            return None
        conn.settimeout(None)
        log("INFO", f"joined the head at {target[0]}:{target[1]} as node rank {topology.node_rank}")
        return conn
    return None
