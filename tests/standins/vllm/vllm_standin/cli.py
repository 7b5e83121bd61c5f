"""The ``vllm`` command: ``vllm serve MODEL [flags]`` and the process lifecycle around the HTTP server.

The order of events copies real vLLM's, because deployment code waits on them: parse and validate flags
(refuse unknown ones, exit 2), bind the API port early (a port clash fails at once), "load weights" for
VLLM_STANDIN_LOAD_SECONDS with the port not yet accepting connections, then listen and answer /health.
SIGTERM or SIGINT stops the server and exits 0. With ``--nnodes`` above 1 the head (rank 0) gathers every
other node before it loads and listens, and ``--headless`` workers join it, then idle without an API server, as
real vLLM's native multi-node mode does (multinode.py).
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from .config import ServeConfig, build_config, standin_version
from .engine import Engine
from .flags import (
    USAGE,
    HelpRequested,
    UsageError,
    default_flags_file,
    help_text,
    load_flag_table,
    parse_serve_args,
)
from .multinode import Head, join_head, watch_connection
from .server import StandinServer
from .weights import offline, offline_snapshot_problem

SUBCOMMANDS = ("chat", "complete", "serve", "launch", "bench", "collect-env", "run-batch")
TOP_USAGE = "usage: vllm [-h] [-v] {" + ",".join(SUBCOMMANDS) + "} ..."


def log(level: str, message: str) -> None:
    """A log line shaped like vLLM's ("INFO 05-07 21:15:36 [where] message"), on stdout where vLLM logs."""
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [standin] {message}", flush=True)


def main(argv: list[str]) -> int:
    """Entry point; returns the process exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(TOP_USAGE + "\n\nStand-in vLLM for tests: only `vllm serve` is implemented.")
        return 0
    if argv[0] in ("-v", "--version"):
        print(standin_version())
        return 0
    if argv[0] != "serve":
        if argv[0] in SUBCOMMANDS:
            print(f"vllm: the stand-in implements only `vllm serve`, not `vllm {argv[0]}`", file=sys.stderr)
        else:
            choices = ", ".join(f"'{c}'" for c in SUBCOMMANDS)
            error = f"argument subparser: invalid choice: '{argv[0]}' (choose from {choices})"
            print(f"{TOP_USAGE}\nvllm: error: {error}", file=sys.stderr)
        return 2

    try:
        table = load_flag_table(default_flags_file())
    except (OSError, ValueError) as error:
        print(f"vllm (stand-in): cannot read the flag list: {error}", file=sys.stderr)
        return 1
    try:
        parsed = parse_serve_args(argv[1:], table)
        config = build_config(parsed)
    except HelpRequested as request:
        print(help_text(table, request.topic), end="")
        return 0
    except UsageError as error:
        # argparse reports unknown arguments from the top-level parser, everything else from `vllm serve`.
        message = str(error)
        prog, usage = ("vllm", TOP_USAGE) if message.startswith("unrecognized arguments") else ("vllm serve", USAGE)
        print(f"{usage}\n{prog}: error: {message}", file=sys.stderr)
        return 2
    except ValueError as error:  # a bad VLLM_STANDIN_* variable
        print(f"vllm (stand-in): {error}", file=sys.stderr)
        return 1
    if "uds" in parsed.values:
        print("vllm (stand-in): --uds is a real vLLM flag but the stand-in serves TCP only", file=sys.stderr)
        return 1
    dests = [name[2:].split(".")[0].replace("-", "_") for name in parsed.given]
    non_default = {dest: parsed.values.get(dest) for dest in dests}
    if parsed.model_tag:
        non_default = {"model_tag": parsed.model_tag, **non_default}
    log("INFO", f"vLLM API server version {config.version}")
    log("INFO", f"non-default args: {non_default}")
    return serve(config)


def serve(config: ServeConfig) -> int:
    """Run until SIGTERM/SIGINT: bind, gather the other nodes, pretend to load, then listen (or idle headless).

    Exit 0 on a signal; 1 when the start fails or, in a multi-node deployment, when another node goes away.
    """
    stop = threading.Event()
    lost_peer = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        log("INFO", f"received signal {signal.Signals(signum).name}, shutting down")
        stop.set()

    def peer_went_away() -> None:
        if not stop.is_set():
            log("ERROR", "a node of this deployment went away: the collective is broken, the engine stops")
            lost_peer.set()
            stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    engine = Engine(config)

    def wedge(_signum: int, _frame: object) -> None:
        log("WARNING", "received SIGUSR1: the engine wedges (stand-in fault): /health stays 200, no token comes")
        engine.wedge()

    signal.signal(signal.SIGUSR1, wedge)
    server = None
    head = None
    worker = None

    def close_all(status: int) -> int:
        if server:
            server.server_close()
        if head:
            head.close()
        if worker:
            worker.close()
        return status

    if not config.headless:
        try:
            server = StandinServer(config, engine)
        except (ImportError, AttributeError, ValueError) as error:  # a --middleware vLLM could not load either
            log("ERROR", f"cannot load --middleware: {error}")
            return close_all(1)
        try:
            server.server_bind()  # vLLM binds the API socket before loading, so a clash fails fast
        except OSError as error:
            log("ERROR", f"cannot bind {config.host}:{config.port}: {error}")
            return close_all(1)

    problem = offline_snapshot_problem(config.model, config.revision) if offline() else None
    speculation = config.speculation
    if offline() and not problem and speculation.draft_model:
        problem = offline_snapshot_problem(speculation.draft_model, speculation.draft_revision)
    if problem:
        log("ERROR", problem)
        return close_all(1)

    topology = config.topology
    if topology and topology.node_rank == 0:
        head = Head(topology, config.model, config.revision)
        try:
            head.bind()
        except OSError as error:
            log(
                "ERROR",
                f"cannot host the rendezvous on --master-addr {topology.master_addr}:{topology.master_port}: {error}",
            )
            return close_all(1)
        log("INFO", f"waiting for {topology.nnodes - 1} more node(s) on {topology.master_addr}:{topology.master_port}")
        if not head.wait_for_workers(stop, log):
            return close_all(0 if stop.is_set() else 1)
        head.watch(peer_went_away)
    elif topology:
        worker = join_head(topology, config.model, config.revision, stop, log)
        if worker is None:
            return close_all(0 if stop.is_set() else 1)
        watch_connection(worker, peer_went_away)

    log("INFO", f"Loading model {config.model} (stand-in: {config.rates.load_seconds:g} s)")
    if stop.wait(config.rates.load_seconds):
        return close_all(1 if lost_peer.is_set() else 0)
    # vLLM 0.33.0's lines (gpu_model_runner.py, api_server/entry.py), which the startup times are read from.
    log("INFO", f"Model loading took 0.25 GiB memory and {config.rates.load_seconds:.6f} seconds")
    log("INFO", f"max_model_len {config.max_model_len}")

    if server is None:
        log("INFO", "Headless mode: engine ready, no API server on this node")
        stop.wait()
        return close_all(1 if lost_peer.is_set() else 0)

    server.server_activate()  # listen() only now: before this, connections are refused
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="http")
    thread.start()
    log("INFO", f"Starting vLLM server on http://{config.host}:{config.port}")
    log("INFO", "Application startup complete.")
    stop.wait()
    server.shutdown()
    thread.join()
    return close_all(1 if lost_peer.is_set() else 0)
