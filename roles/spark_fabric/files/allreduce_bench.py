"""The fabric's bandwidth test, run inside the pinned vLLM image on every Spark of a group at once: an all-reduce
through torch.distributed with the image's own torch and NCCL (or the host's, as the group's units will load it),
over the sockets and RDMA devices the environment names, printed in NVIDIA's nccl-tests format so that one parser
(module_utils/nccl_bandwidth.py) reads this and nccl-tests alike. In place only (torch reduces in place): one
`time algbw busbw #wrong` group per row.

Environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torch's env:// rendezvous), and NCCL's own variables.
The buffers stay small next to the unified pool (a 16 GiB nccl-tests run froze a Spark: dgx-spark-playbooks#102).

    python3 allreduce_bench.py [--backend nccl|gloo] [--min-bytes N] [--max-bytes N] [--iters N] [--warmup N]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # nccl: the GPU and the fabric, what the gate measures. gloo: the same collective over TCP on the CPU, to check
    # the rendezvous and the sockets where no GPU answers.
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--min-bytes", type=int, default=32 << 20)
    parser.add_argument("--max-bytes", type=int, default=512 << 20)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout-s", type=int, default=300)
    return parser.parse_args(argv)


def sizes(args: argparse.Namespace) -> list[int]:
    found, size = [], max(4, args.min_bytes)
    while size <= args.max_bytes:
        found.append(size - size % 4)
        size *= max(2, args.factor)
    return found


def main(argv: list[str]) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    args = arguments(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpu = args.backend == "nccl"
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout_s))

    def synchronize() -> None:
        if gpu:
            torch.cuda.synchronize(device)

    def say(line: str) -> None:
        if rank == 0:
            print(line, flush=True)

    say("# Collective test starting: all_reduce_perf (sparkfleet allreduce_bench.py, torch.distributed)")
    say(f"# torch {torch.__version__} backend {args.backend} nccl {_nccl_version(torch) if gpu else 'n/a'}")
    say(f"#  Rank {rank:2d} on {socket.gethostname()} of {world}")
    say("#                                                              in-place")
    say("#       size         count      type   redop    root     time   algbw   busbw  #wrong")
    say("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")
    factor = 2 * (world - 1) / world
    busbws = []
    for size in sizes(args):
        count = size // 4
        buffer = torch.ones(count, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(buffer)
        synchronize()
        buffer.fill_(1.0)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buffer)
        synchronize()
        seconds = (time.perf_counter() - started) / args.iters
        # Each all-reduce sums the ranks' values: ones become world ** iters, exact in float32 below 2 ** 24; beyond
        # that the check cannot tell, and the row says N/A as nccl-tests does.
        expected = float(world) ** args.iters
        wrong = str(int((buffer != expected).sum().item())) if expected < 2**24 else "N/A"
        algbw = size / seconds / 1e9
        busbw = algbw * factor
        busbws.append(busbw)
        say(
            f"{size:12d}  {count:12d}  {'float':>8}  {'sum':>6}  {-1:6d}  {seconds * 1e6:7.1f}  {algbw:6.2f}  "
            f"{busbw:6.2f}  {wrong:>6}"
        )
        del buffer
    say("# Out of bounds values : 0 OK")
    say(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):g}")
    say("#")
    say("# Collective test concluded: all_reduce_perf")
    dist.destroy_process_group()
    return 0


def _nccl_version(torch) -> str:
    version = torch.cuda.nccl.version()
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
