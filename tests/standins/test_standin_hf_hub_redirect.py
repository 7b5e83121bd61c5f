"""The stand-in Hub's LFS redirect (ROOT/lfs_redirect.json) with the REAL huggingface_hub client.

The Hub answers a weight file's /resolve with a 302 to a CDN on another host and puts the file's identity
(X-Repo-Commit, X-Linked-Etag, X-Linked-Size) on the redirect itself; huggingface_hub reads those from the HEAD and
downloads from the Location. If the real client downloads the right bytes through the stand-in's redirect and sends
no token to the "CDN" (localhost instead of 127.0.0.1, the same process), the redirect is shaped like the Hub's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("safetensors")

from helpers import hf_standin
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.utils import close_session

BUILD = hf_standin.builder()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(stand-in URL, root) with the LFS redirect on, the client isolated from the machine's token, proxy and Xet."""
    root = hf_standin.build_fixture_models(tmp_path_factory.mktemp("hf-root"))
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
            patch.delenv(name, raising=False)
        for name, value in {"HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(home)}.items():
            patch.setenv(name, value)
        patch.setenv("NO_PROXY", "127.0.0.1,localhost")
        patch.setenv("no_proxy", "127.0.0.1,localhost")
        patch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        patch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        patch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
        close_session()
        with hf_standin.running_standin(root) as url:
            hf_standin.set_lfs_redirect(root, url.replace("127.0.0.1", "localhost"))
            yield url, root
            hf_standin.set_lfs_redirect(root, None)
        close_session()


def test_the_real_client_downloads_a_private_shard_through_the_redirect_without_leaking_the_token(hub, tmp_path):
    url, root = hub
    files = hf_standin.fixture_files(root, BUILD.PRIVATE, _main(root, BUILD.PRIVATE))
    hf_standin.reset(url)

    path = hf_hub_download(
        BUILD.PRIVATE,
        "model.safetensors",
        cache_dir=tmp_path / "cache",
        token=BUILD.PRIVATE_TOKEN,
        endpoint=url,
    )

    assert Path(path).read_bytes() == files["model.safetensors"]
    stats = hf_standin.stats(url)
    assert stats["redirects"] >= 1
    assert stats["cdn_requests"] >= 1
    assert stats["cdn_requests_with_authorization"] == 0
    assert stats["bytes_served"][f"{BUILD.PRIVATE}/model.safetensors"] == len(files["model.safetensors"])


def test_small_files_are_not_redirected(hub, tmp_path):
    url, root = hub
    files = hf_standin.fixture_files(root, BUILD.QWEN, _main(root, BUILD.QWEN))
    hf_standin.reset(url)
    path = hf_hub_download(BUILD.QWEN, "config.json", cache_dir=tmp_path / "cache", token=False, endpoint=url)
    assert Path(path).read_bytes() == files["config.json"]
    assert hf_standin.stats(url)["redirects"] == 0


def _main(root: Path, repo_id: str) -> str:
    """The commit the fixture repo's main ref names."""
    return json.loads(root.joinpath(*repo_id.split("/"), "repo.json").read_text())["refs"]["main"]
