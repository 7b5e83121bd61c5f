"""library/vllm_image_flags.py in-process (tests/unit/conftest.py's run_module), with Docker's answers replaced by
the help vLLM 0.33.0 really printed (tests/contracts/vllm/)."""

from __future__ import annotations

import pytest
from ansible.module_utils import basic
from helpers import ROOT

HELP_0_33 = (ROOT / "tests" / "contracts" / "vllm" / "serve-help-all.txt").read_text(encoding="utf-8")
IMAGE_ID = "sha256:" + "ab" * 32


class FakeDocker:
    """Answers `docker image inspect` and `docker run ... vllm serve --help=all`, and counts the runs."""

    def __init__(self, help_text: str = HELP_0_33, run_rc: int = 0, harmony_offline: bool = True) -> None:
        self.help_text, self.run_rc, self.harmony_offline, self.runs = help_text, run_rc, harmony_offline, []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[1:3] == ["image", "inspect"]:
            return 0, IMAGE_ID + "\n", ""
        if "python3" in argv:  # the harmony probe, run with --network none
            self.runs.append(argv)
            return (0, "", "") if self.harmony_offline else (1, "", "HarmonyError: error downloading vocab")
        self.runs.append(argv)
        return self.run_rc, self.help_text if self.run_rc == 0 else "", "" if self.run_rc == 0 else "boom"


@pytest.fixture
def run(run_module, monkeypatch):
    """run(args, docker, check=False): the module's result, with DOCKER answering its docker commands."""

    def run_with(args: dict, docker: FakeDocker, check: bool = False) -> dict:
        monkeypatch.setattr(basic.AnsibleModule, "run_command", lambda _self, argv, **_kwargs: docker(argv))
        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda _self, _name, required=False: "/usr/bin/docker")
        return run_module("vllm_image_flags", args, check_mode=check)

    return run_with


def recipe(**flags) -> dict:
    return {"gpu_memory_utilization": 0.5, "max_model_len": 4096, "max_num_seqs": 4, "kv_cache_dtype": "auto",
            "serve_flags": flags}  # fmt: skip


def args(tmp_path, *recipes: dict) -> dict:
    models = [{"label": f"vllm_server_models[{index}]", "recipe": item} for index, item in enumerate(recipes)]
    return {"image": "vllm/vllm-openai:cu130-nightly", "cache_dir": str(tmp_path / "cache"), "models": models}


def test_reads_the_images_help_once_and_caches_it(run, tmp_path):
    docker = FakeDocker()
    first = run(args(tmp_path, recipe(**{"reasoning-parser": "qwen3"})), docker)
    assert first["changed"] is True and first["problems"] == [] and first["flags"] == 320
    assert docker.runs[0][-4:] == ["vllm", IMAGE_ID, "serve", "--help=all"]
    assert "--gpus" in docker.runs[0]
    second = run(args(tmp_path, recipe()), docker)
    assert second["changed"] is False
    assert len(docker.runs) == 1  # the second run read the cache, keyed by the image ID
    assert (tmp_path / "cache" / ("sha256-" + "ab" * 32 + ".help.txt")).read_text() == HELP_0_33


def test_a_flag_the_image_lacks_fails_with_did_you_mean(run, tmp_path):
    result = run(args(tmp_path, recipe(), recipe(**{"max-num-batched-token": 8192})), FakeDocker())
    assert result["failed"]
    assert result["problems"] == [
        "vllm_server_models[1].serve_flags.max-num-batched-token: --max-num-batched-token is not a flag of "
        "`vllm serve` in the pinned image's vLLM (sha256:abababababab); did you mean 'max-num-batched-tokens'?"
    ]


def test_an_older_image_refuses_a_flag_the_committed_list_has(run, tmp_path):
    # An image whose vLLM predates --max-num-scheduled-tokens: the image, not the committed list, decides.
    older = "\n".join(line for line in HELP_0_33.splitlines() if "--max-num-scheduled-tokens" not in line)
    result = run(args(tmp_path, recipe(**{"max-num-scheduled-tokens": 4096})), FakeDocker(older))
    assert result["failed"]
    assert "--max-num-scheduled-tokens is not a flag of `vllm serve` in the pinned image" in result["msg"]


def test_a_kv_cache_dtype_outside_the_images_choices_fails(run, tmp_path):
    result = run(args(tmp_path, recipe() | {"kv_cache_dtype": "half"}), FakeDocker())
    assert result["failed"]
    assert "vllm_server_models[0].kv_cache_dtype='half'" in result["msg"]


def test_check_mode_runs_no_container(run, tmp_path):
    docker = FakeDocker()
    result = run(args(tmp_path, recipe()), docker, check=True)
    assert result["changed"] is True and result["flags"] == 0
    assert docker.runs == []
    assert not (tmp_path / "cache").exists()


def test_a_failing_help_run_fails_and_caches_nothing(run, tmp_path):
    result = run(args(tmp_path, recipe()), FakeDocker(run_rc=1))
    assert result["failed"] and "exit 1" in result["msg"]
    assert not (tmp_path / "cache").exists()


GPT_OSS = recipe(**{"reasoning-parser": "openai_gptoss"})


def test_gpt_oss_on_an_image_that_downloads_its_vocabulary_fails_with_the_fix(run, tmp_path):
    docker = FakeDocker(harmony_offline=False)
    result = run(args(tmp_path, recipe(), GPT_OSS), docker)
    assert result["failed"] and result["harmony_offline"] is False
    [problem] = result["problems"]
    assert problem.startswith("vllm_server_models[1]: the image sha256:abababababab cannot start gpt-oss offline")
    assert "TIKTOKEN_ENCODINGS_BASE" in problem and "446a9538" in problem
    assert docker.runs[-1][5:7] == ["--network", "none"]


def test_gpt_oss_on_an_image_that_carries_its_vocabulary_passes_and_is_probed_once(run, tmp_path):
    docker = FakeDocker()
    assert run(args(tmp_path, GPT_OSS), docker)["harmony_offline"] is True
    assert run(args(tmp_path, GPT_OSS), docker)["changed"] is False
    assert len(docker.runs) == 2  # one help read, one harmony probe: both cached per image ID


def test_local_vocabulary_files_or_other_models_need_no_probe(run, tmp_path):
    docker = FakeDocker(harmony_offline=False)
    local = GPT_OSS | {"env": {"TIKTOKEN_ENCODINGS_BASE": "/etc/encodings"}}
    result = run(args(tmp_path, local, recipe()), docker)
    assert result["problems"] == [] and result["harmony_offline"] is None
    assert len(docker.runs) == 1
