"""The vllm_quality_gate module through real Ansible (`ansible localhost -m`): on real answers of the real vLLM
engine (SmolLM2-135M-Instruct), canaries are recorded and then held, needles come back at 10/50/90 % of a prompt
the model holds, and a streamed soak passes; on the stand-in vLLM misbehaving on purpose (VLLM_STANDIN_FAULT_*),
each check catches its fault and names the request and what came back. One engine and one stand-in per module."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.vllm_engine import SHARED_ENGINE_KEY
from helpers.vllm_standin import Server, start_server, stop_server

KEY = SHARED_ENGINE_KEY  # the shared engine's, and the stand-ins'
CAPITAL = "What is the capital of France? Answer in one word."
GREETING = "Say hello in one short sentence."
# SmolLM2 finds a needle anywhere in 4,000 tokens of prose (measured with this engine); the engine fixture serves
# 2,048 tokens, so the needles sit in 1,500.
NEEDLE_DEPTH = 1500
MODEL = {"hf_repo": "HuggingFaceTB/SmolLM2-135M-Instruct", "hf_revision": "12fd25f77366fa6b3b4b768ec3050bf629380bac"}


@pytest.fixture
def engine(smollm2_engine: str) -> str:
    """The real engine the integration tests share (conftest.py): SmolLM2 as "smollm2", behind KEY."""
    return smollm2_engine


@contextmanager
def standin(tmp: Path, faults: dict[str, str], args: tuple[str, ...] = ()) -> Iterator[Server]:
    """A stand-in vLLM with the key and these faults (VLLM_STANDIN_FAULT_*) and serve arguments, stopped on exit."""
    env = {"VLLM_STANDIN_LOAD_SECONDS": "0.1", "VLLM_STANDIN_DECODE_TOK_S": "2000", **faults}
    server = start_server(tmp, ["org/model", "--served-model-name", "standin", "--api-key", KEY, *args], env)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def gate(run_ansible_module):
    """gate(url, served, **args) -> the module's result against that endpoint, with the key."""

    def run(url: str, served: str, **args) -> dict:
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
        arguments = json.dumps({"url": url, "served": served, "api_key": KEY, **args})
        return run_ansible_module("vllm_quality_gate", env, arguments)

    return run


def test_canaries_are_recorded_then_held_on_real_answers(engine, gate, tmp_path):
    record = tmp_path / "smollm2.last-good.canaries.json"
    asked = {"canaries": [CAPITAL, GREETING], "record_file": str(record), "model": MODEL}
    recorded = gate(engine, "smollm2", **asked)
    assert not recorded.get("failed"), recorded
    assert "Paris" in recorded["answers"][CAPITAL]
    assert recorded["changed"] and recorded["recorded"] == sorted([CAPITAL, GREETING]) and recorded["held"] == []
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    assert json.loads(record.read_text())["answers"] == recorded["answers"]
    # The next start: greedy answers are the same, so the recorded ones hold, and nothing is written.
    held = gate(engine, "smollm2", **asked)
    assert not held.get("failed"), held
    assert not held["changed"] and held["held"] == sorted([CAPITAL, GREETING]) and held["recorded"] == []
    # A record made for another revision holds nothing: the new revision records its own answers.
    moved = gate(engine, "smollm2", **{**asked, "model": {**MODEL, "hf_revision": "0" * 40}})
    assert moved["held"] == [] and moved["recorded"] == sorted([CAPITAL, GREETING])


def test_a_recorded_answer_that_changed_fails_and_names_both_answers(engine, gate, tmp_path):
    record = tmp_path / "smollm2.last-good.canaries.json"
    identity = {**MODEL, "max_tokens": 64}
    record.write_text(json.dumps({"model": identity, "answers": {CAPITAL: "The capital of France is Lyon."}}))
    done = gate(engine, "smollm2", canaries=[CAPITAL], record_file=str(record), model=MODEL)
    assert done.get("failed")
    assert (
        f"canary {CAPITAL!r}: expected 'The capital of France is Lyon.', got" in done["msg"] and "Paris" in done["msg"]
    )
    # A failed gate records nothing; rerecord (after a deliberate change) records the new answer.
    assert "Lyon" in record.read_text()
    again = gate(engine, "smollm2", canaries=[CAPITAL], record_file=str(record), model=MODEL, rerecord=True)
    assert not again.get("failed") and again["recorded"] == [CAPITAL] and "Paris" in record.read_text()


def test_a_canary_answer_that_changed_fails_naming_the_prompt_and_both_answers(engine, gate):
    done = gate(engine, "smollm2", canaries=[CAPITAL], expected={CAPITAL: "The capital of France is Lyon."})
    assert done.get("failed")
    assert (
        f"smollm2 failed its quality gate: canary {CAPITAL!r}: expected 'The capital of France is Lyon.'" in done["msg"]
    )
    assert "Paris" in done["msg"]
    # The key never reaches the result.
    assert KEY not in json.dumps(done)


def test_needles_come_back_from_a_real_model(engine, gate):
    done = gate(engine, "smollm2", needle_depth_tokens=NEEDLE_DEPTH)
    assert not done.get("failed"), done
    assert [needle["fraction"] for needle in done["needles"]] == [0.1, 0.5, 0.9]
    # Counted with the model's tokenizer: vLLM's own count of each prompt is close to the depth asked.
    assert all(NEEDLE_DEPTH * 0.9 < needle["prompt_tokens"] < NEEDLE_DEPTH * 1.2 for needle in done["needles"])


def test_a_streamed_soak_passes_on_the_real_engine(engine, gate):
    done = gate(engine, "smollm2", soak_requests=6, soak_concurrency=3, soak_max_tokens=16)
    assert not done.get("failed"), done
    assert done["soak"]["requests"] == 6
    assert 0 < done["soak"]["completion_tokens"] <= 6 * 16


def test_a_server_that_answers_garbage_after_some_requests_fails_its_canary(tmp_path, gate):
    # Right twice (the recording start and the next), then wrong: the third canary fails.
    with standin(tmp_path, {"VLLM_STANDIN_FAULT_WRONG_AFTER": "2"}) as server:
        recorded = gate(server.base, "standin", canaries=[CAPITAL])
        assert not recorded.get("failed"), recorded
        assert not gate(server.base, "standin", canaries=[CAPITAL], expected=recorded["answers"]).get("failed")
        done = gate(server.base, "standin", canaries=[CAPITAL], expected=recorded["answers"])
    assert done.get("failed")
    assert f"canary {CAPITAL!r}: expected {recorded['answers'][CAPITAL]!r:.40}" in done["msg"]


def test_speculation_that_changes_the_answers_fails_the_canaries_recorded_without_it(tmp_path, gate):
    """Greedy answers must not change when speculative decoding is turned on: the canaries recorded at the last
    good start without it hold the start with it (a draft path that corrupts the output, VLLM_STANDIN_FAULT_SPEC_WRONG,
    answers wrongly only while speculating)."""
    record = tmp_path / "standin.last-good.canaries.json"
    held = {"canaries": [CAPITAL], "record_file": str(record), "model": MODEL}
    fault = {"VLLM_STANDIN_FAULT_SPEC_WRONG": "1"}
    (tmp_path / "plain").mkdir()
    with standin(tmp_path / "plain", fault) as server:
        assert not gate(server.base, "standin", **held).get("failed")
    speculative = ("--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3}))
    (tmp_path / "speculating").mkdir()
    with standin(tmp_path / "speculating", fault, speculative) as server:
        done = gate(server.base, "standin", **held)
    assert done.get("failed")
    recorded = json.loads(record.read_text())
    assert f"canary {CAPITAL!r}: expected" in done["msg"], done["msg"]
    assert recorded, "the recording of the good start stays"


def test_a_stream_cut_short_fails_the_soak(tmp_path, gate):
    with standin(tmp_path, {"VLLM_STANDIN_FAULT_TRUNCATE_AFTER": "3"}) as server:
        done = gate(server.base, "standin", soak_requests=6, soak_concurrency=2)
    assert done.get("failed")
    assert "failed its quality gate: soak request" in done["msg"]
    assert "the stream ends without data: [DONE] (cut short?)" in done["msg"]


def test_a_model_that_loses_the_start_of_its_context_fails_the_early_needle(tmp_path, gate):
    # The stand-in reads only the last 600 words of the prompt: the needle at 10 % of 1,000 is beyond them.
    with standin(tmp_path, {"VLLM_STANDIN_FAULT_CONTEXT_WORDS": "600"}) as server:
        done = gate(server.base, "standin", needle_depth_tokens=1000)
    assert done.get("failed")
    assert "failed its quality gate: needle at 10% of 1000 tokens: the number" in done["msg"]
    assert "is not in the answer: 'The quick brown fox" in done["msg"]


def test_the_stand_in_without_faults_passes_every_check(tmp_path, gate):
    with standin(tmp_path, {}) as server:
        recorded = gate(server.base, "standin", canaries=[CAPITAL], soak_requests=4, soak_concurrency=2,
                        needle_depth_tokens=1000)  # fmt: skip
        held = gate(server.base, "standin", canaries=[CAPITAL], expected=recorded["answers"])
        # The needles' depth stays within a quarter of max_model_len.
        capped = gate(server.base, "standin", needle_depth_tokens=100000, max_model_len=2000)
    assert not recorded.get("failed") and not held.get("failed"), (recorded, held)
    assert [needle["fraction"] for needle in recorded["needles"]] == [0.1, 0.5, 0.9]
    assert {needle["depth_tokens"] for needle in capped["needles"]} == {500}


def test_bad_settings_fail_before_any_request(gate):
    done = gate("http://127.0.0.1:9", "x", soak_concurrency=0, needle_fractions=[1.5], budget_s=0)
    assert done.get("failed")
    for named in ("soak_concurrency (0) must be at least 1", "needle_fractions [1.5]", "budget_s (0.0) must be"):
        assert named in done["msg"]
