"""The fleet gate's rules: keys checked in preflight without a key in any message, the aliases the Sparks publish,
and the keys file (module_utils/gate_keys.py); the gate's reading of answers and its error shapes
(roles/fleet_router/files/fleet_gate.py)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import sys

import pytest
from gate_keys import aliases, keys_file, problems, warnings, webui_entry, webui_problems
from helpers import ROOT

_spec = importlib.util.spec_from_file_location(
    "fleet_gate", ROOT / "roles" / "fleet_router" / "files" / "fleet_gate.py"
)
fleet_gate = importlib.util.module_from_spec(_spec)
sys.modules["fleet_gate"] = fleet_gate  # its dataclasses look their module up there
_spec.loader.exec_module(fleet_gate)

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef"
SPARKS = "sparks-key-0123456789"


def test_good_keys_pass():
    keys = [{"name": "alice", "key": ALICE, "requests_per_minute": 60, "concurrent": 2}, {"name": "bob", "key": BOB}]
    assert problems(keys, SPARKS) == []


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([], "fleet_router_keys is empty, so no one could use the endpoint"),
        ([{"name": "alice"}], "fleet_router_keys[0] (alice).key is empty: set it from Ansible Vault"),
        ([{"name": "alice", "key": "short-key"}], "fleet_router_keys[0] (alice).key is shorter than 16 characters"),
        ([{"name": "alice", "key": ALICE + " x"}], "fleet_router_keys[0] (alice).key (value hidden) contains a space"),
        ([{"name": "al ice", "key": ALICE}], "fleet_router_keys[0].name='al ice'"),
        ([{"name": "alice", "key": ALICE}, {"name": "alice", "key": BOB}], "the name alice is used twice"),
        ([{"name": "alice", "key": ALICE}, {"name": "bob", "key": ALICE}], "(bob).key is another entry's key too"),
        ([{"name": "alice", "key": ALICE, "concurrent": -1}], "(alice).concurrent=-1: a whole number"),
        ([{"name": "alice", "key": ALICE, "requests_per_minute": "60"}], "(alice).requests_per_minute='60'"),
        ([{"name": "alice", "key": ALICE, "enabled": "no"}], "(alice).enabled='no': true or false"),
        ([{"name": "alice", "key": ALICE, "limit": 3}], "(alice): unknown keys limit"),
        ("alice", "fleet_router_keys: expected a list"),
    ],
)
def test_each_bad_entry_is_named_and_no_key_is_shown(keys, message):
    found = problems(keys, SPARKS)
    assert any(message in problem for problem in found), found
    for problem in found:
        assert ALICE not in problem and BOB not in problem and "short-key" not in problem


@pytest.mark.parametrize(("spark_key", "message"), [("", "is empty"), ("a b", "contains a space"), (None, "is empty")])
def test_the_sparks_key_is_required(spark_key, message):
    found = problems([{"name": "alice", "key": ALICE}], spark_key)
    assert found and found[0].startswith("fleet_router_spark_key") and message in found[0]


UI = {
    "key": "open-webui-key-0123456789",
    "secret_key": "s" * 32,
    "admin_email": "admin@fleet.example",
    "admin_password": "a-long-password",
    "network": False,
    "tls": False,
}


def test_good_webui_settings_pass_and_its_key_is_named_open_webui():
    assert webui_problems(UI, [{"name": "alice", "key": ALICE}]) == []
    assert webui_problems(UI | {"network": True, "tls": True}, []) == []
    # 44 characters that are a Fernet key (openssl rand -base64 32 in URL-safe form) are fine.
    fernet = base64.urlsafe_b64encode(bytes(range(32))).decode()
    assert len(fernet) == 44 and webui_problems(UI | {"secret_key": fernet}, []) == []
    assert webui_entry(UI["key"]) == {"name": "open-webui", "key": UI["key"]}


@pytest.mark.parametrize(
    ("change", "keys", "message"),
    [
        ({"key": ""}, [], "fleet_router_webui_key is empty"),
        ({"key": "k3y-9x"}, [], "fleet_router_webui_key is shorter than 16"),
        ({"key": ALICE}, [], "fleet_router_webui_key is another entry's key too"),
        ({}, [{"name": "open-webui", "key": BOB}], "fleet_router_keys has an entry named open-webui"),
        ({"secret_key": ""}, [], "fleet_router_webui_secret_key is empty"),
        ({"secret_key": "s" * 31}, [], "fleet_router_webui_secret_key is shorter than 32"),
        ({"secret_key": "s p" * 16}, [], "fleet_router_webui_secret_key (value hidden) contains a space"),
        ({"secret_key": "s" * 44}, [], "fleet_router_webui_secret_key has 44 characters"),  # not a Fernet key
        ({"admin_password": "pw-9x7"}, [], "fleet_router_webui_admin_password is shorter than 12"),
        ({"admin_email": "admin"}, [], "fleet_router_webui_admin_email='admin' is not an e-mail address"),
        ({"network": True}, [], "set fleet_router_tls_certificate"),
    ],
)
def test_each_bad_webui_setting_is_named_and_no_secret_is_shown(change, keys, message):
    settings = UI | change
    found = webui_problems(settings, [*keys, {"name": "alice", "key": ALICE}])
    assert len(found) == 1 and message in found[0], found
    for secret in (settings["key"], settings["secret_key"], settings["admin_password"], ALICE, BOB):
        assert secret not in found[0] or secret == "", found


def test_the_keys_file_holds_digests_limits_and_aliases_but_no_key():
    keys = [{"name": "alice", "key": ALICE, "concurrent": 2}, {"name": "bob", "key": BOB, "enabled": False}]
    written = keys_file(keys, {"gpt-4o-mini": "qwen3-0.6b"})
    assert written == {
        "keys": [
            {
                "name": "alice",
                "sha256": hashlib.sha256(ALICE.encode()).hexdigest(),
                "enabled": True,
                "requests_per_minute": 0,
                "concurrent": 2,
            },
            {
                "name": "bob",
                "sha256": hashlib.sha256(BOB.encode()).hexdigest(),
                "enabled": False,
                "requests_per_minute": 0,
                "concurrent": 0,
            },
        ],
        "aliases": {"gpt-4o-mini": "qwen3-0.6b"},
    }
    text = json.dumps(written)
    assert ALICE not in text and BOB not in text
    # The gate reads it: alice by her key's digest, bob (revoked) not at all.
    config = fleet_gate.parse_config(text)
    assert [key.name for key in config.keys_by_hash.values()] == ["alice"]
    assert config.aliases == {"gpt-4o-mini": "qwen3-0.6b"}


def test_aliases_come_from_the_sparks_and_clashes_are_named():
    endpoints = [
        {"served": "qwen3-0.6b", "aliases": ["gpt-4o-mini", "small"]},
        {"served": "qwen3-0.6b", "aliases": ["gpt-4o-mini"]},
        {"served": "gpt-oss-120b", "aliases": []},
    ]
    assert aliases(endpoints) == ({"gpt-4o-mini": "qwen3-0.6b", "small": "qwen3-0.6b"}, [])
    clashing = [*endpoints, {"served": "gpt-oss-120b", "aliases": ["small", "qwen3-0.6b"]}]
    _, clashes = aliases(clashing)
    assert clashes == [
        "qwen3-0.6b is an alias of gpt-oss-120b and the served name of another model",
        "small is an alias of both qwen3-0.6b and gpt-oss-120b",
    ]


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"keys": [{"name": "alice", "sha256": "abc"}]}),
        "{not json",
        json.dumps([]),
        json.dumps({"keys": {"name": "alice"}}),
        json.dumps({"keys": ["alice"]}),
        json.dumps({"keys": [], "aliases": ["a"]}),
    ],
    ids=["short-digest", "not-json", "a-list", "keys-a-mapping", "entry-a-string", "aliases-a-list"],
)
def test_a_damaged_keys_file_is_refused_so_the_gate_keeps_the_last_good_one(text):
    with pytest.raises(ValueError):
        fleet_gate.parse_config(text)


def test_the_gate_keeps_the_last_good_keys_when_the_file_is_damaged_and_refuses_all_when_it_is_gone(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(keys_file([{"name": "alice", "key": ALICE}], {})))
    keys = fleet_gate.KeysFile(str(path))
    digest = hashlib.sha256(ALICE.encode()).hexdigest()
    assert keys.config.keys_by_hash[digest].name == "alice"
    path.write_text('{"keys": {"broken": true}}')
    keys.reload(force=True)
    assert keys.config.keys_by_hash[digest].name == "alice"
    path.unlink()
    keys.reload(force=True)
    assert keys.config.keys_by_hash == {}


def test_the_gate_serves_the_paths_haproxy_forwards_and_no_other():
    """The gate's path rule is HAProxy's (the front on a network endpoint), so a loopback endpoint, with no HAProxy,
    refuses vllm-router's admin API just the same."""
    front = (ROOT / "roles" / "fleet_router" / "templates" / "etc" / "haproxy" / "haproxy.cfg.j2").read_text()
    (haproxy_rule,) = re.findall(r"acl sparkfleet_openai path_reg '([^']+)'", front)
    assert fleet_gate.API_PATH.pattern == haproxy_rule
    for path in ("/workers", "/add_worker", "/v1/../workers", "/v1//workers", "/v1/%2e%2e/workers", "/metrics", "/"):
        assert not fleet_gate.API_PATH.match(path), path
    for path in ("/v1/chat/completions", "/v1/messages/count_tokens", "/v1/models/qwen3-0.6b"):
        assert fleet_gate.API_PATH.match(path), path


def test_a_client_key_that_is_the_sparks_key_is_warned_about_without_showing_it():
    keys = [{"name": "fleet", "key": SPARKS}, {"name": "alice", "key": ALICE}]
    (warning,) = warnings(keys, SPARKS)
    assert warning.startswith("fleet_router_keys[0] (fleet) is the Sparks' own key") and SPARKS not in warning
    assert warnings([{"name": "alice", "key": ALICE}], SPARKS) == []


@pytest.mark.parametrize(
    ("answer", "tokens"),
    [
        ({"object": "chat.completion", "usage": {"prompt_tokens": 7, "completion_tokens": 5}}, (7, 5)),
        ({"object": "response", "usage": {"input_tokens": 9, "output_tokens": 4}}, (9, 4)),
        ({"type": "message", "usage": {"input_tokens": 3, "output_tokens": 8}}, (3, 8)),
        (
            {"type": "message", "usage": {"input_tokens": 3, "cache_read_input_tokens": 5, "output_tokens": 8}},
            (8, 8),
        ),
        ({"object": "list", "data": []}, (0, 0)),
    ],
    ids=["chat", "responses", "messages", "messages-cached", "no-usage"],
)
def test_usage_is_read_from_each_apis_answer(answer, tokens):
    assert fleet_gate.usage_of(answer) == tokens


def sse(*events: dict | str) -> bytes:
    return b"".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events)


@pytest.mark.parametrize(
    ("stream", "tokens"),
    [
        (
            sse(
                {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "hi"}}]},
                {
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": {"prompt_tokens": 6, "completion_tokens": 2},
                },
                "[DONE]",
            ),
            (6, 2),
        ),
        (
            b"event: response.created\n"
            + sse({"type": "response.created", "response": {"usage": None}})
            + b"event: response.completed\n"
            + sse({"type": "response.completed", "response": {"usage": {"input_tokens": 11, "output_tokens": 3}}}),
            (11, 3),
        ),
        (
            b"event: message_start\n"
            + sse({"type": "message_start", "message": {"usage": {"input_tokens": 12, "output_tokens": 1}}})
            + sse({"type": "message_delta", "usage": {"output_tokens": 4}})
            + sse({"type": "message_delta", "usage": {"output_tokens": 9}})
            + sse({"type": "message_stop"}),
            (12, 9),  # message_delta's output_tokens is the total so far, message_start's included
        ),
        (sse({"object": "chat.completion.chunk", "choices": [{"delta": {"content": "hi"}}]}, "[DONE]"), (0, 0)),
        (
            # continuous_usage_stats (and the Sparks' --enable-force-include-usage): every chunk has the total so far
            sse(
                *(
                    {"object": "chat.completion.chunk", "usage": {"prompt_tokens": 10, "completion_tokens": n}}
                    for n in (1, 2, 3)
                ),
                "[DONE]",
            ),
            (10, 3),
        ),
    ],
    ids=["chat", "responses", "messages", "chat-without-usage", "chat-continuous-usage"],
)
def test_usage_is_counted_in_a_stream_cut_anywhere(stream, tokens):
    for cut in range(1, len(stream), 7):  # bytes arrive in any pieces; the stream is passed on unchanged
        counter = fleet_gate.StreamUsage()
        counter.feed(stream[:cut])
        counter.feed(stream[cut:])
        assert counter.totals() == tokens


def test_refusals_have_each_apis_own_shape():
    openai = fleet_gate.error_body("chat", 401, "no")
    assert openai == {
        "error": {"message": "no", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    }
    anthropic = fleet_gate.error_body("messages", 429, "slow down")
    assert anthropic == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert fleet_gate.api_of("/v1/messages/count_tokens") == "messages"
    assert fleet_gate.api_of("/v1/chat/completions") == "chat" and fleet_gate.api_of("/v1/completions") == "completions"


def test_a_model_list_is_read_in_either_shape():
    assert fleet_gate.served_names({"models": ["a", "b", "a"]}) == ["a", "b"]  # vllm-router 0.1.17
    assert fleet_gate.served_names({"object": "list", "data": [{"id": "a"}]}) == ["a"]  # OpenAI's


@pytest.mark.parametrize(
    ("api", "body", "asked"),
    [
        ("chat", {"stream": True}, True),
        ("completions", {"stream": True, "stream_options": {"continuous_usage_stats": True}}, True),
        ("chat", {"stream": True, "stream_options": {"include_usage": True}}, False),  # the client asked itself
        ("chat", {"stream": False}, False),
        ("chat", {}, False),
        ("messages", {"stream": True}, False),  # Anthropic's and the Responses streams always report usage
        ("responses", {"stream": True}, False),
    ],
)
def test_the_gate_asks_for_the_usage_of_a_stream_whose_client_did_not(api, body, asked):
    sent, hidden = fleet_gate.asking_for_usage(api, json.dumps({"model": "m", **body}).encode())
    assert hidden is asked
    options = json.loads(sent).get("stream_options") or {}
    assert options.get("include_usage", False) is (
        asked or bool((body.get("stream_options") or {}).get("include_usage"))
    )
    assert fleet_gate.asking_for_usage("chat", b"not json") == (b"not json", False)


def test_the_usage_event_the_gate_asked_for_is_kept_from_the_client_wherever_the_stream_is_cut():
    token = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
    stream = token + token + usage + b"data: [DONE]\n\n"
    for cut in range(1, len(stream)):
        hidden = fleet_gate.HiddenUsage()
        passed = hidden.feed(stream[:cut]) + hidden.feed(stream[cut:]) + hidden.end()
        assert passed == token + token + b"data: [DONE]\n\n", cut
