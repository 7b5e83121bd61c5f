"""What an inventory value may be (module_utils/input_rules.py), the module that applies the rules in preflight
(library/input_check.py), and the quoting helpers the templates write values through (filter_plugins/quoting.py).
The hostile values are the ones a review rendered into units and config files (issue 17)."""

from __future__ import annotations

import importlib.util
import shlex

import input_rules
import pytest
from ansible.errors import AnsibleFilterError
from helpers import ROOT

spec = importlib.util.spec_from_file_location("sparkfleet_quoting", ROOT / "filter_plugins" / "quoting.py")
quoting = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quoting)

GOOD = {
    "image": [
        "vllm/vllm-openai:cu130-nightly",
        "127.0.0.1:5000/vllm/vllm-openai:cu130-nightly",
        "registry.example:5000/vllm/vllm-openai:v0.24.0-ubuntu2404",
        "vllm/vllm-openai@sha256:" + "a" * 64,
        "vllm/vllm-openai:cu130-nightly@sha256:" + "0" * 64,
        "sha256:" + "b" * 64,
    ],
    "address": ["127.0.0.1", "0.0.0.0", "10.77.0.20", "::1", "fe80::1"],
    "host": ["spark-1", "spark-1.lab.example", "10.0.0.5", "::1"],
    "network": ["10.0.0.0/8", "192.168.100.11", "fd00::/64"],
    "port": [1, 8000, 65535],
    "path": ["/var/lib/sparkfleet", "/etc/sparkfleet/vllm", "/opt/sparkfleet/hf-venv", "/srv/a+b@c"],
    "served_name": ["qwen3-0.6b", "openai/gpt-oss-20b", "Nemotron_3.Super-120B"],
    "folder_name": ["speculation-off", "run.2", "A_b"],
    "hf_repo": ["Qwen/Qwen3-0.6B", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "sparkfleet-test/qwen3.5-moe-vl"],
    "hf_commit": ["c1899de289a04d12100db370d81485cdf75e47ca", "0" * 40],
    "hf_revision": ["c1899de289a04d12100db370d81485cdf75e47ca", "main", "v1.0", "refs/pr/1"],
    "duration": ["30s", "5m", "1h30m", "15d", "500ms", "4w"],
    "url": ["https://huggingface.co", "https://mirror.lab.example:8443/hf", "http://127.0.0.1:8480", "http://[::1]:80"],
    "key_url": ["https://nvidia.github.io/libnvidia-container/gpgkey", "file:///srv/keys/nvidia.gpg"],
    "text": ["Say hello in one short sentence.", "1", ""],
    "secret": ["sk-sparkfleet-test-4c1f0e", "hf_AbC123"],
}

BAD = {
    "image": [
        ("--privileged --volume /:/host vllm/vllm-openai:latest", "contains a space"),
        ("vllm/vllm-openai:latest\nExecStartPre=/bin/sh -c id", "control character"),
        ("-v/:/host", "starts with '-'"),
        ("vllm/VLLM-openai:latest", "repository lowercase"),
        ("vllm/vllm-openai@sha256:abc", "of the form"),
        ("vllm/vllm-openai:t\u00e4g", "of the form"),
        ("", "not an image reference"),
    ],
    "address": [
        ("0.0.0.0\nExecStartPre=/bin/touch /pwned", "control character"),
        ("localhost", "not an IP address"),
        ("10.0.0.300", "not an IP address"),
        ("10.0.0.0/8", "not an IP address"),
        ("fe80::1%x] --web.enable-admin-api --x=[", "IPv6 scope"),
        ("fe80::1%a b", "IPv6 scope"),
    ],
    "host": [("spark 1", "not an IP address or a host name"), ("-spark", "not an IP address or a host name")],
    "network": [
        ("*", "allows every address"),
        ("0.0.0.0/0", "allows every address"),
        ("10.0.0.0/0", "allows every address"),
        ("::0/0", "allows every address"),
        ("10.0.0.0/8\n[root]\n path = /", "control character"),
        ("10.0.0.0/33", "not an IP address or a network"),
    ],
    "port": [(0, "not a port"), (65536, "not a port"), ("8000", "not a whole number"), (True, "not a whole number")],
    "path": [
        ("var/lib", "not an absolute path"),
        ("/var/lib/spark:fleet", "contains ':'"),
        ("/var/lib/../../etc", "contains '..'"),
        ("/var/lib/spark fleet", "outside letters"),
        ("/var/lib/x\nExecStart=/bin/sh", "control character"),
    ],
    "served_name": [
        ("../../../../tmp/x", "may hold only"),
        ('qwen"; rm -rf /', "may hold only"),
        ("qwen\nx", "control character"),
        ("/qwen", "may hold only"),
        ("a" * 129, "longer than 128"),
    ],
    "folder_name": [
        ("../x", "may hold only"),
        ("a/b", "may hold only"),
        (".hidden", "may hold only"),
        ("", "may hold only"),
        ("x\ny", "control character"),
        ("a" * 65, "may hold only"),
    ],
    "hf_repo": [
        ("no-org", "is not a Hugging Face repo id ORG/NAME"),
        ("org/name/extra", "is not a Hugging Face repo id ORG/NAME"),
        ("../etc/passwd", "is not a Hugging Face repo id ORG/NAME"),
        ("-org/name", "is not a Hugging Face repo id ORG/NAME"),
        ("org/name\n", "control character"),
        ("", "is not a Hugging Face repo id"),
        (None, "is not a Hugging Face repo id"),
    ],
    "hf_commit": [
        ("main", "is not a pinned commit: 40 lowercase hex digits"),
        ("C1899DE289A04D12100DB370D81485CDF75E47CA", "40 lowercase hex digits"),
        ("c1899de289a04d12100db370d81485cdf75e47c", "40 lowercase hex digits"),
        ("c1899de289a04d12100db370d81485cdf75e47ca\n", "40 lowercase hex digits"),
        (None, "is not a pinned commit"),
    ],
    "hf_revision": [
        ("", "is not a revision"),
        ("main..x", "is not a revision"),
        ("main/", "is not a revision"),
        ("-main", "is not a revision"),
        ("main\n", "control character"),
        (None, "is not a revision"),
    ],
    "duration": [("5 minutes", "not a Prometheus duration"), ("", "not a Prometheus duration")],
    "url": [
        ("http://mirror.lab.example/hf", "plain http to another machine"),
        ("ftp://mirror", "not an https URL"),
        ("https://mirror\n", "control character"),
        ("file:///srv/hub", "not an https URL"),
    ],
    "key_url": [("http://keys.example/gpgkey", "plain http")],
    "text": [("Say hello\nExecStartPre=/bin/sh", "control character"), ("\x1b[31m", "control character")],
    "secret": [("sk-key\n", "control character"), ("sk key", "contains a space")],
}


@pytest.mark.parametrize(("kind", "value"), [(kind, value) for kind, values in GOOD.items() for value in values])
def test_good_values_pass(kind, value):
    assert input_rules.problem(kind, value) is None


@pytest.mark.parametrize(("kind", "value", "reason"), [(kind, *case) for kind, cases in BAD.items() for case in cases])
def test_bad_values_are_refused_with_the_reason(kind, value, reason):
    assert reason in (input_rules.problem(kind, value) or "")


def test_every_kind_has_good_and_bad_cases():
    assert set(GOOD) == set(input_rules.KINDS) == set(BAD)


# --- library/input_check.py ------------------------------------------------------------------------------------


def test_input_check_lists_every_bad_value_with_its_variable(run_module):
    result = run_module(
        "input_check",
        {
            "values": [
                {"name": "vllm_server_image", "value": "a b", "kind": "image"},
                {"name": "vllm_server_listen_address", "value": "127.0.0.1", "kind": "address"},
                {"name": "vllm_server_stop_timeout_s", "value": -5, "kind": "integer", "min": 1, "fix": "give 1-3600"},
                {"name": "vllm_server_image", "value": "", "kind": "image", "optional": True},
            ],
        },
    )
    assert result["failed"]
    assert result["problems"] == [
        "vllm_server_image='a b' contains a space (an image reference is one word; Docker would read the rest as "
        "more arguments)",
        "vllm_server_stop_timeout_s=-5 is less than 1: give 1-3600",
    ]
    assert result["msg"].startswith("Bad input, nothing was changed:\n- vllm_server_image=")


def test_input_check_names_a_bad_secret_but_never_shows_it(run_module):
    key = "sk-secret-never-shown\nExecStartPre=/bin/id"
    result = run_module("input_check", {"secrets": {"vllm_server_api_key": key, "vllm_server_hf_token": ""}})
    assert result["failed"]
    assert "vllm_server_api_key (value hidden) contains a control character" in result["msg"]
    assert "sk-secret-never-shown" not in str(result)


def test_input_check_passes_good_values_and_counts_them(run_module):
    result = run_module(
        "input_check",
        {
            "values": [{"name": "p", "value": "8000", "kind": "port"}, {"name": "n", "value": "7", "kind": "integer"}],
            "secrets": {"k": "sk-1"},
        },
    )
    assert not result.get("failed"), result
    assert result["checked"] == 3


# --- filter_plugins/quoting.py ---------------------------------------------------------------------------------


def test_systemd_word_quotes_and_escapes_and_refuses_a_line_break():
    assert quoting.systemd_word('a "b" $HOME 50% c\\d') == '"a \\"b\\" $$HOME 50%% c\\\\d"'
    assert quoting.systemd_word("--privileged --volume /:/host x") == '"--privileged --volume /:/host x"'
    with pytest.raises(AnsibleFilterError, match="control character"):
        quoting.systemd_word("vllm/vllm-openai:latest\nExecStartPre=/bin/id")


def test_env_file_value_round_trips_through_the_shell():
    for value in ("sk-plain", 'it\'s $HOME `id` "x"', ""):
        assert shlex.split(f"X={quoting.env_file_value(value)}") == [f"X={value}"]
    with pytest.raises(AnsibleFilterError):
        quoting.env_file_value("a\nb")


def test_rsyncd_value_refuses_what_rsyncd_would_read_otherwise():
    assert quoting.rsyncd_value("10.0.0.0/24 10.0.1.5") == "10.0.0.0/24 10.0.1.5"
    for bad in ("10.0.0.0/8\n[root]\n path = /", " 10.0.0.1"):
        with pytest.raises(AnsibleFilterError):
            quoting.rsyncd_value(bad)


# --- library/vllm_image_lock.py --------------------------------------------------------------------------------

REF = "vllm/vllm-openai:cu130-nightly"
DIGEST = "sha256:" + "1" * 64


def read_lock(run_module, tmp_path, text: str | None) -> dict:
    path = tmp_path / "vllm-image.lock.yml"
    if text is not None:
        path.write_text(text)
    return run_module("vllm_image_lock", {"path": str(path), "ref": REF}, check_mode=True)


def test_the_lock_gives_the_references_pin(run_module, tmp_path):
    text = f"images:\n  {REF}:\n    digest: {DIGEST}\n    image_id: {DIGEST}\n    pinned_at: '2026-12-01T10:00:00Z'\n"
    result = read_lock(run_module, tmp_path, text)
    assert result["locked"] == {"digest": DIGEST, "image_id": DIGEST, "pinned_at": "2026-12-01T10:00:00Z"}


@pytest.mark.parametrize("text", [None, ""])
def test_no_lock_yet_pins_nothing(run_module, tmp_path, text):
    assert read_lock(run_module, tmp_path, text)["locked"] == {}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("images: [\n", "is not YAML"),
        ("- a\n- b\n", "the file holds list"),
        (f"images:\n  {REF}: {DIGEST}\n", "is str, expected a mapping"),
        (f"images:\n  {REF}:\n    digest: sha256:abc\n", "digest is 'sha256:abc', expected sha256:<64 hex digits>"),
        (f"images:\n  {REF}:\n    digset: {DIGEST}\n", "digset is not a key of a pin"),
        (f"images:\n  {REF}:\n    pinned_at: now\n", "pins nothing"),
    ],
    ids=["not-yaml", "a-list", "entry-not-a-mapping", "short-digest", "misspelt-key", "no-pin"],
)
def test_a_damaged_lock_is_refused_naming_the_variable(run_module, tmp_path, text, said):
    result = read_lock(run_module, tmp_path, text)
    assert result["failed"]
    assert result["msg"].startswith("vllm_image_lock_file (")
    assert said in result["msg"]
