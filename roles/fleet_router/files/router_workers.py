#!/usr/bin/env python3
"""Keep vllm-router's worker list equal to the fleet's, through the router's own admin API (standard library only).

vllm-router in multi-model mode (--enable-igw) learns its workers at run time (POST /workers {url, model_id},
DELETE /workers/<url>, GET /workers), not from its command line. sparkfleet's unit runs `sync` after every
start, and the update playbook takes one Spark out (`remove`) and puts it back (`add`) around its update.
Every command prints one JSON object: what it added and removed, and the workers' health where it waited.

  router_workers.py sync   --router http://127.0.0.1:8080 --workers /etc/sparkfleet/router/workers.json
  router_workers.py remove --router http://127.0.0.1:8080 --url http://10.0.0.2:8000
  router_workers.py add    --router http://127.0.0.1:8080 --url http://10.0.0.2:8000 --model qwen3-0.6b
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def call(router: str, method: str, path: str, body: object | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    request = urllib.request.Request(router + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        detail = error.read().decode()[:300]
        raise SystemExit(f"router_workers: {method} {router}{path}: HTTP {error.code} {detail}") from None
    try:
        return json.loads(text)
    except ValueError:
        return text


def wait_for_router(router: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            call(router, "GET", "/health")
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
            if time.monotonic() > deadline:
                raise SystemExit(f"router_workers: the router at {router} did not answer /health: {error}") from None
            time.sleep(0.5)


def workers(router: str) -> dict[str, dict]:
    """The router's workers by URL."""
    return {worker["url"]: worker for worker in call(router, "GET", "/workers")["workers"]}


def add(router: str, url: str, model: str) -> None:
    answer = call(router, "POST", "/workers", {"url": url, "model_id": model})
    if not isinstance(answer, dict) or not answer.get("success"):
        raise SystemExit(f"router_workers: the router refused {url} ({model}): {answer}")


def remove(router: str, url: str) -> None:
    call(router, "DELETE", "/workers/" + urllib.parse.quote(url, safe=""))


def wait_healthy(router: str, url: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if workers(router).get(url, {}).get("is_healthy"):
            return True
        time.sleep(1)
    return False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["sync", "add", "remove", "list"])
    parser.add_argument("--router", required=True, help="base URL of the router, e.g. http://127.0.0.1:8080")
    parser.add_argument("--workers", help="sync: JSON list of {url, model} the router must hold, no more")
    parser.add_argument("--url", help="add/remove: the worker's base URL")
    parser.add_argument("--model", help="add: the served model name")
    parser.add_argument("--wait", type=float, default=60, help="seconds to wait for the router (and, for add, health)")
    args = parser.parse_args(argv)

    wait_for_router(args.router, args.wait)
    current = workers(args.router)
    added: list[str] = []
    removed: list[str] = []
    if args.command == "sync":
        with open(args.workers, encoding="utf-8") as handle:
            wanted = {entry["url"]: entry["model"] for entry in json.load(handle)}
        for url, model in wanted.items():
            if url in current and current[url].get("model_id") != model:
                remove(args.router, url)
                removed.append(url)
                current.pop(url)
            if url not in current:
                add(args.router, url, model)
                added.append(url)
        for url in set(current) - set(wanted):
            remove(args.router, url)
            removed.append(url)
        print(json.dumps({"added": added, "removed": sorted(removed)}))
    elif args.command == "remove":
        if args.url in current:
            remove(args.router, args.url)
            removed.append(args.url)
        print(json.dumps({"added": [], "removed": removed}))
    elif args.command == "add":
        if args.url not in current:
            add(args.router, args.url, args.model)
            added.append(args.url)
        healthy = wait_healthy(args.router, args.url, args.wait)
        print(json.dumps({"added": added, "removed": [], "healthy": healthy}))
        return 0 if healthy else 3
    else:
        print(json.dumps({"workers": list(current.values())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
