"""The vllm_bench role's Spark Arena profile through a real ansible-playbook run on localhost: the role builds its
llama-benchy venv (pip from the wheelhouse fixture, as an air-gapped site installs from its mirror), runs the
leaderboard's harness against an endpoint on 127.0.0.1 with a book served on loopback, and writes the Arena table,
arena.json, arena.csv and arena.png beside the scenarios.

Against the stand-in vLLM, whose rates are known, the figures llama-benchy measures must come within 5 % of them;
against the real engine (SmolLM2 on these 2 cores), every depth and concurrency must come back measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, ansible_tool
from helpers.vllm_engine import SHARED_ENGINE_KEY, SMOLLM2, real_model
from helpers.vllm_standin import Server, start_server, stop_server
from helpers.word_tokenizer import write_word_tokenizer

WHEELS = ROOT / ".cache" / "fixtures" / "wheels"
# Real prose for the prompts, on every Debian machine (base-files).
BOOK = Path("/usr/share/common-licenses/GPL-3")
KEY = "arena-key"
# The stand-in's known rates, and a batching cost: two requests decoding together each wait 1.5 token times.
# A 512-token prefill then takes about a second: a busy machine's few tens of milliseconds of scheduling stay a
# small part of what is measured.
PREFILL_TOK_S = 500.0
DECODE_TOK_S = 50.0
BATCH_COST = 0.5
STANDIN_ENV = {
    "VLLM_STANDIN_LOAD_SECONDS": "0.1",
    "VLLM_STANDIN_PREFILL_TOK_S": str(PREFILL_TOK_S),
    "VLLM_STANDIN_DECODE_TOK_S": str(DECODE_TOK_S),
    "VLLM_STANDIN_BATCH_COST": str(BATCH_COST),
}
STANDIN_MAX_MODEL_LEN = 4096


@pytest.fixture(scope="module")
def book_url() -> Iterator[str]:
    """The book on a loopback HTTP server, as a site's own copy would be served."""
    handler = partial(SimpleHTTPRequestHandler, directory=str(BOOK.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{BOOK.name}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the role builds llama-benchy's venv: one for the module, so the second run finds it built."""
    if not (WHEELS / ".stamp").is_file():
        pytest.skip(f"the wheelhouse fixture is missing at {WHEELS}: tests/run-all.sh setup builds it")
    return tmp_path_factory.mktemp("arena") / "llama-benchy"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["org/standin", "--served-model-name", "standin", "--api-key", KEY, "--enable-prefix-caching"]
    server = start_server(
        tmp_path_factory.mktemp("standin"), [*args, "--max-model-len", str(STANDIN_MAX_MODEL_LEN)], STANDIN_ENV
    )
    yield server
    stop_server(server)


def run_role(tmp: Path, endpoint: dict, key: str, venv: Path, book_url: str, arena: dict) -> dict:
    """One playbook on localhost: the endpoint fact the "Model serving" play would publish, then the role with
    one short scenario, no sweep, and this Arena profile. The ansible-playbook run and the results folder."""
    variables = {
        "vllm_server_endpoints": [endpoint],
        "sparkfleet_api_key": key,
        "vllm_bench_results_dir": str(tmp / "results"),
        "vllm_bench_scenarios": [{"name": "short", "prompt_tokens": 32, "output_tokens": 4}],
        "vllm_bench_runs": 1,
        "vllm_bench_sweep_max_concurrency": 0,
        "vllm_bench_arena_venv": str(venv),
        "vllm_bench_arena_pip_environment": {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS)},
        "vllm_bench_arena_book_url": book_url,
        "ansible_python_interpreter": sys.executable,
        **{f"vllm_bench_arena_{key}": value for key, value in arena.items()},
    }
    play = {"hosts": "spark-1", "gather_facts": False, "vars": variables, "roles": ["vllm_bench"]}
    (tmp / "play.yml").write_text(yaml.safe_dump([play]))
    argv = [ansible_tool("ansible-playbook"), "-i", "spark-1,", "-c", "local", str(tmp / "play.yml")]
    env = os.environ | {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-6000:]
    assert key not in said
    return {"said": said, "folder": tmp / "results" / "spark-1" / endpoint["served"]}


def endpoint_fact(served: str, url: str, snapshot: Path, max_model_len: int) -> dict:
    return {
        "served": served,
        "kind": "chat",
        "port": int(url.rsplit(":", 1)[1]),
        "url": url,
        "unit": f"vllm-{served}.service",
        "recipe": "smollm2-135m-instruct",
        "image_shown": "vllm/vllm-openai@sha256:abc",
        "memory": "a plan",
        "hf_repo": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "hf_revision": "12fd25f77366fa6b3b4b768ec3050bf629380bac",
        "snapshot": str(snapshot),
        "max_model_len": max_model_len,
        "prefix_caching": True,
    }


def by_pair(folder: Path) -> dict:
    arena = json.loads((folder / "arena.json").read_text())
    return arena, {(row["depth"], row["concurrency"]): row for row in arena["rows"]}


def test_the_arena_profile_measures_the_standins_known_rates(tmp_path, standin, venv, book_url):
    snapshot = write_word_tokenizer(tmp_path / "snapshot", BOOK.read_text())
    endpoint = endpoint_fact("standin", standin.base, snapshot, STANDIN_MAX_MODEL_LEN)
    profile = {"depths": [0, 1024, 4096], "prompt_tokens": 512, "output_tokens": 32, "concurrency": [1, 2], "runs": 1}
    run = run_role(tmp_path, endpoint, KEY, venv, book_url, profile)
    arena, rows = by_pair(run["folder"])
    # 4,096 + 512 + 32 tokens do not fit the stand-in's 4,096: skipped, and said.
    assert arena["skipped_depths"] == [4096]
    assert sorted(rows) == [(0, 1), (0, 2), (1024, 1), (1024, 2)]
    for depth in (0, 1024):
        alone, two = rows[(depth, 1)], rows[(depth, 2)]
        assert alone["prefill_tok_s"] == pytest.approx(PREFILL_TOK_S, rel=0.05), alone
        assert alone["decode_tok_s"] == pytest.approx(DECODE_TOK_S, rel=0.05), alone
        # Two at once: each decodes at 50 / 1.5 tok/s; the stand-in prefills them side by side.
        assert two["decode_per_request_tok_s"] == pytest.approx(DECODE_TOK_S / (1 + BATCH_COST), rel=0.05), two
        assert two["decode_tok_s"] == pytest.approx(2 * DECODE_TOK_S / (1 + BATCH_COST), rel=0.05), two
        assert two["prefill_tok_s"] == pytest.approx(2 * PREFILL_TOK_S, rel=0.05), two
    # With a depth, llama-benchy loaded the context first and measured the prompt on the cached context.
    assert rows[(1024, 1)]["context_prefill_tok_s"] == pytest.approx(PREFILL_TOK_S, rel=0.05)
    assert rows[(0, 1)]["context_prefill_tok_s"] is None
    assert [report["version"] for report in arena["reports"]] == ["0.4.0"] * 4
    report = (run["folder"] / "report.md").read_text()
    assert "## Spark Arena profile (llama-benchy)" in report
    assert "Depths 4096 were skipped" in report
    assert (run["folder"] / "arena.png").read_bytes().startswith(b"\x89PNG")
    assert (run["folder"] / "arena.csv").read_text().startswith("depth,concurrency,")
    assert "arena d1024 c1: prefill" in run["said"]


def test_the_arena_profile_measures_the_real_engine(tmp_path, smollm2_engine, venv, book_url):
    """llama-benchy against real vLLM: its tokenizer is SmolLM2's own, from the model's folder, and every depth and
    concurrency comes back with both speeds (a CPU's figures: what is checked is that they were measured)."""
    endpoint = endpoint_fact("smollm2", smollm2_engine, real_model(SMOLLM2), 2048)
    # One depth (the context-load phase and the prompt on it), one and two at once: the stand-in test covers depth 0.
    profile = {"depths": [256], "prompt_tokens": 128, "output_tokens": 8, "concurrency": [1, 2], "runs": 1}
    run = run_role(tmp_path, endpoint, SHARED_ENGINE_KEY, venv, book_url, profile)
    arena, rows = by_pair(run["folder"])
    assert arena["skipped_depths"] == []
    assert sorted(rows) == [(256, 1), (256, 2)]
    for row in rows.values():
        assert row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0 and row["ttft_ms"] > 0, row
        # With prefix caching, the 256-token contexts were loaded first, and that prefill was measured too.
        assert row["context_prefill_tok_s"] > 0, row
