"""Where real vLLM finds a model's files when the Hub is off limits (HF_HUB_OFFLINE=1), and its failure when
they are not there.

vLLM resolves a Hub model id through huggingface_hub's cache: <HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub>/models--<org>--<name>/snapshots/<commit>/, a branch name being looked up in refs/.
It reads config.json first; offline, a missing snapshot ends the start with huggingface_hub's
LocalEntryNotFoundError. The stand-in checks the same place, so a test proves that pre-fetched weights sit
where the vLLM container looks, without loading anything.
"""

from __future__ import annotations

import os

TRUE = ("1", "on", "yes", "true")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def hub_cache() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def offline_snapshot_problem(model: str, revision: str | None) -> str | None:
    """huggingface_hub's words when `model` at `revision` is not in the cache and the Hub may not be asked,
    or None when its config.json is there (or the model is a local folder)."""
    if os.path.isdir(model) or model.count("/") != 1:
        return None
    folder = os.path.join(hub_cache(), "models--" + model.replace("/", "--"))
    revision = revision or "main"
    commit = revision
    try:
        with open(os.path.join(folder, "refs", revision), encoding="utf-8") as handle:
            commit = handle.read().strip()
    except OSError:
        pass
    if os.path.isfile(os.path.join(folder, "snapshots", commit, "config.json")):
        return None
    return (
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder for "
        f"the specified revision on the local disk and outgoing traffic has been disabled. To enable repo look-ups "
        f"and downloads online, pass 'local_files_only=False' as input. (model {model}, revision {revision}, "
        f"cache {hub_cache()})"
    )
