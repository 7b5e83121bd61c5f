#!/usr/bin/env python3
"""How exact is sparkfleet's benchmark client (module_utils/openai_bench.py), and how fast can it measure?

1. Accuracy: the stand-in vLLM (tests/standins/vllm) with known rates (default the published Spark figures,
   1800 tok/s prefill, 23 tok/s decode) serves the blog's five scenarios; the client's TTFT, total, prefill and
   decode figures are compared with the stand-in's timing model (TTFT = prompt / prefill rate, then one token
   every 1 / decode rate). Goal (issue 7): every figure within 5%.
2. Ceiling: what the client can still measure when the server is (nearly) free:
   - against the stand-in set very fast: the highest decode tok/s of one request, the ITL and TTFT floors,
     and the highest aggregate output tok/s of a concurrency sweep (client and stand-in share the CPUs);
   - against a bare socket server that streams a pre-rendered answer instantly: the client alone.

Everything runs on 127.0.0.1. Usage: .venv/bin/python bench/bench-client-accuracy.py [--runs 3] [--speed 1]
(--speed 4 runs the accuracy part with 4x faster rates, a quarter of the time).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "module_utils"))
import openai_bench as ob  # noqa: E402 -- importable once module_utils is on sys.path

VLLM = ROOT / "tests" / "standins" / "vllm" / "vllm"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_standin(prefill: float, decode: float, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "VLLM_STANDIN_LOAD_SECONDS": "0.1"}
    env.update(VLLM_STANDIN_PREFILL_TOK_S=str(prefill), VLLM_STANDIN_DECODE_TOK_S=str(decode))
    argv = [str(VLLM), "serve", "m", "--host", "127.0.0.1", "--port", str(port), *flags]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return process, url
        except OSError:
            time.sleep(0.05)
    process.terminate()
    raise SystemExit(f"stand-in on {url} did not start")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=10)


def error(measured: float, expected: float) -> str:
    return f"{(measured - expected) / expected * 100:+6.1f}%"


def accuracy(runs: int, speed: float) -> None:
    prefill, decode = 1800.0 * speed, 23.0 * speed
    print(f"## Accuracy: stand-in at {prefill:g} tok/s prefill, {decode:g} tok/s decode; median of {runs} runs")
    process, url = start_standin(prefill, decode)
    try:
        endpoint = ob.Endpoint(url, "m")
        maker = ob.PromptMaker(endpoint, 7234)
        header = f"{'scenario':26} {'TTFT s':>15} {'err':>7} {'total s':>15} {'err':>7} {'prefill':>8} {'err':>7}"
        print(header + f" {'decode':>7} {'err':>7}")
        for scenario in ob.default_scenarios():
            row = ob.run_scenario(endpoint, maker, scenario, runs, 1, {}, None)
            ttft = scenario.prompt_tokens / prefill
            total = ttft + (scenario.output_tokens - 1) / decode
            print(
                f"{scenario.name:26} {row['ttft_s']:7.3f}/{ttft:7.3f} {error(row['ttft_s'], ttft)} "
                f"{row['total_s']:7.3f}/{total:7.3f} {error(row['total_s'], total)} "
                f"{row['prefill_tok_s']:8.1f} {error(row['prefill_tok_s'], prefill)} "
                f"{row['decode_tok_s']:7.2f} {error(row['decode_tok_s'], decode)}"
            )
    finally:
        stop(process)
    print("(measured/model; err = measured vs the stand-in's timing model)\n")


def ceiling_standin() -> None:
    print("## Ceiling against the stand-in set very fast (1e9 tok/s prefill, 1e6 tok/s decode)")
    process, url = start_standin(1e9, 1e6, "--max-num-seqs", "256")
    try:
        endpoint = ob.Endpoint(url, "m")
        maker = ob.PromptMaker(endpoint, 58)
        results = [ob.measure_request(endpoint, maker.prompt(58), 2000) for _ in range(3)]
        best = max(results, key=lambda r: r.decode_tok_s or 0)
        itl = [gap for r in results for gap in r.inter_token_s]
        print(
            f"one request, 2000 tokens: decode up to {best.decode_tok_s:,.0f} tok/s; ITL p50 "
            f"{ob.percentile(itl, 50) * 1e6:.0f} us, p99 {ob.percentile(itl, 99) * 1e6:.0f} us; "
            f"TTFT floor (58 tokens) {min(r.ttft_s for r in results) * 1e3:.2f} ms"
        )
        sweep = ob.run_sweep(endpoint, maker, [1, 2, 4, 8, 16], 32, prompt=58, output=500)
        for row in sweep["levels"]:
            print(
                f"  concurrency {row['concurrency']:2}: aggregate {row['output_tok_s']:9,.0f} tok/s, "
                f"ITL p50 {row['itl_p50_s'] * 1e6:6.0f} us, failures {row['failures']}"
            )
    finally:
        stop(process)
    print()


class InstantServer(threading.Thread):
    """A bare socket server that answers /v1/models, /tokenize and a completion stream at once: the client's
    own ceiling, with no server work in the way."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def run(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            request_line = reader.readline().decode()
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = json.loads(reader.read(length) or b"{}")
            if "/v1/models" in request_line:
                self.send_json(conn, {"data": [{"id": "m"}]})
            elif "/tokenize" in request_line:
                self.send_json(conn, {"count": 64, "max_model_len": 4096, "tokens": list(range(3, 67))})
            else:
                conn.sendall(self.stream(len(body["prompt"]), body["max_tokens"]))

    @staticmethod
    def stream(prompt: int, tokens: int) -> bytes:
        chunk = b'data: {"choices":[{"index":0,"text":" x","finish_reason":null}]}\n\n'
        usage = json.dumps({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": tokens}})
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
        return head + chunk * tokens + b"data: " + usage.encode() + b"\n\ndata: [DONE]\n\n"

    @staticmethod
    def send_json(conn: socket.socket, body: dict) -> None:
        raw = json.dumps(body).encode()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(raw) + raw
        )


def ceiling_client() -> None:
    tokens = 20000
    server = InstantServer()
    server.start()
    endpoint = ob.Endpoint(server.url, "m")
    ob.check_model(endpoint)
    maker = ob.PromptMaker(endpoint, 58)
    results = [ob.measure_request(endpoint, maker.prompt(58), tokens) for _ in range(3)]
    itl = [gap for r in results for gap in r.inter_token_s]
    best = max(r.decode_tok_s for r in results)
    short = [ob.measure_request(endpoint, maker.prompt(58), 2).ttft_s for _ in range(20)]
    print(f"## Ceiling of the client alone (instant server, {tokens} one-token chunks per request)")
    print(f"TTFT floor (request out, first chunk in): median {ob.percentile(short, 50) * 1e3:.2f} ms")
    print(
        f"parses up to {best:,.0f} chunks/s (= decode tok/s it can time); ITL p50 "
        f"{ob.percentile(itl, 50) * 1e6:.1f} us, p99 {ob.percentile(itl, 99) * 1e6:.1f} us\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--speed", type=float, default=1.0, help="multiply the published rates (shorter run)")
    parser.add_argument("--skip-accuracy", action="store_true", help="measure only the ceilings")
    args = parser.parse_args()
    print(
        f"# bench-client-accuracy: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"Python {sys.version.split()[0]}\n"
    )
    if not args.skip_accuracy:
        accuracy(args.runs, args.speed)
    ceiling_standin()
    ceiling_client()


if __name__ == "__main__":
    main()
