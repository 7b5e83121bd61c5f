"""A recipe's speculative decoding: its `speculative` block, checked against the pinned vLLM's SpeculativeConfig
and rendered as `--speculative-config`.

    speculative:
      method: mtp                  # one of SpeculativeConfig's methods (recipes/vllm-speculative-config.json)
      num_speculative_tokens: 3
      draft: {hf_repo: ..., hf_revision: <40 hex>}   # the draft model, for the methods that need one
      moe_backend: triton          # any other key: one of SpeculativeConfig's, passed through

The method names and the keys come from the release itself (tests/contracts/vllm/regenerate.py writes
recipes/vllm-speculative-config.json from vLLM 0.33.0's SpeculativeConfig). Which methods need a draft model is
vLLM's own rule (vllm/config/speculative.py, SpeculativeConfig.__post_init__ in 0.33.0): without `model`, "mtp"
and "dspark" use the target checkpoint's own layers, "ngram", "ngram_gpu" and "suffix" need no model at all, and
every other method stops with "num_speculative_tokens was provided but without speculative model". The draft is
fetched and verified like the main weights and named by repository and revision, which vLLM finds in the Hugging
Face cache offline.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path

from ansible.module_utils import input_rules

CONTRACT_FILE = "vllm-speculative-config.json"

# Methods that need no draft model: the target checkpoint's own layers, or no model at all.
OWN_LAYERS = ("mtp", "dspark")
NO_MODEL = ("ngram", "ngram_gpu", "suffix")
# Methods a recipe may not use, and why.
REFUSED = {
    "custom_class": "it loads the Python class its 'model' names: a recipe runs no code of its own",
    "extract_hidden_states": "it extracts hidden states for training drafts; it does not speed up decoding",
}
# Keys sparkfleet writes itself: the block's own, and the draft's repository and revision.
OWN_KEYS = ("method", "num_speculative_tokens", "draft")
FROM_DRAFT = {"model": "draft.hf_repo", "revision": "draft.hf_revision"}


class ContractError(Exception):
    """The speculative-config contract is missing or unreadable."""


def load_contract(recipes_dir: str | Path) -> dict:
    """recipes/vllm-speculative-config.json: methods, mtp_aliases and keys of the pinned release."""
    path = Path(recipes_dir) / CONTRACT_FILE
    try:
        contract = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ContractError(f"cannot read {path}: {error} (tests/contracts/vllm/regenerate.py writes it)") from error
    return contract


def _did_you_mean(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def needs_draft(method: str) -> bool:
    return method not in OWN_LAYERS + NO_MODEL


def problems(block: object, contract: Mapping, label: str) -> list[str]:
    """Every problem with a recipe's speculative block (LABEL names it), each with the fix."""
    if not isinstance(block, Mapping):
        expected = "a mapping with method, num_speculative_tokens and, for a method that needs one, draft"
        return [f"{label}: expected {expected}, or no 'speculative'"]
    found: list[str] = []
    method = block.get("method")
    methods = contract["methods"]
    if not isinstance(method, str) or not method:
        found.append(f"{label}.method is missing: one of {', '.join(methods)}")
    elif method in contract.get("mtp_aliases", []):
        release = f"vLLM {contract['vllm_version']}"
        found.append(f"{label}.method={method!r}: {release} takes it as a deprecated name of 'mtp': write mtp")
    elif method in REFUSED:
        found.append(f"{label}.method={method!r}: not supported, {REFUSED[method]}")
    elif method not in methods:
        found.append(
            f"{label}.method={method!r} is not a speculative method of vLLM {contract['vllm_version']}"
            f"{_did_you_mean(method, methods)}"
        )
    valid = method if isinstance(method, str) and method in methods and method not in REFUSED else None
    tokens = block.get("num_speculative_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        found.append(f"{label}.num_speculative_tokens={tokens!r}: expected a positive integer (tokens per step)")
    found += _draft_problems(block, valid, label)
    for key, value in block.items():
        where = f"{label}.{key}"
        if key in OWN_KEYS:
            continue
        if key in FROM_DRAFT:
            why = "the draft is fetched and pinned like the model's weights"
            found.append(f"{where}: set {label}.{FROM_DRAFT[key]} instead ({why})")
        elif key not in contract["keys"]:
            found.append(
                f"{where}: not a key of vLLM {contract['vllm_version']}'s SpeculativeConfig"
                f"{_did_you_mean(str(key), contract['keys'])}"
            )
        elif not isinstance(value, (str, int, float, bool, list)):
            found.append(f"{where}={value!r}: expected a value or a list of values")
        elif _text_problem(value):
            found.append(f"{where}={value!r}: {_text_problem(value)}")
    return found


def _text_problem(value: object) -> str | None:
    """Each item as it reaches the unit's command line: one line of text (json.dumps would hide a newline)."""
    items = value if isinstance(value, list) else [value]
    return next((found for item in items if (found := input_rules.text(str(item)))), None)


def _draft_problems(block: Mapping, method: str | None, label: str) -> list[str]:
    """The draft model: required by the methods that need one, refused by the others (METHOD None: a method
    already found wrong), pinned."""
    draft = block.get("draft")
    if draft is None:
        if method and needs_draft(method):
            return [f"{label}.draft is missing: method {method!r} needs a draft model, as {{hf_repo, hf_revision}}"]
        return []
    if method and not needs_draft(method):
        return [f"{label}.draft: method {method!r} uses no draft model; remove it"]
    if not isinstance(draft, Mapping):
        return [f"{label}.draft: expected {{hf_repo, hf_revision}}"]
    found = []
    if input_rules.hf_repo(draft.get("hf_repo")):
        found.append(f"{label}.draft.hf_repo={draft.get('hf_repo')!r}: {input_rules.hf_repo(draft.get('hf_repo'))}")
    if input_rules.hf_commit(draft.get("hf_revision")):
        found.append(
            f"{label}.draft.hf_revision={draft.get('hf_revision')!r}: expected a pinned commit of the draft's"
            " repository, 40 lowercase hex digits"
        )
    return found


def served_without(recipe: Mapping) -> dict:
    """The recipe as served with speculation turned off (vllm_server_speculation false): its speculative block
    left out, so that neither the command line, the plan nor the fetch counts a draft. The rest is the recipe's."""
    return {key: value for key, value in recipe.items() if key != "speculative"}


def draft(block: Mapping | None) -> dict | None:
    """The draft model of a checked block, as {hf_repo, hf_revision}, or None."""
    found = (block or {}).get("draft")
    return {"hf_repo": found["hf_repo"], "hf_revision": found["hf_revision"]} if found else None


def config(block: Mapping) -> dict:
    """The JSON of --speculative-config for a checked block: method, num_speculative_tokens, the draft as model
    and revision, then the block's other keys as written."""
    rendered = {"method": block["method"], "num_speculative_tokens": block["num_speculative_tokens"]}
    found = draft(block)
    if found:
        rendered |= {"model": found["hf_repo"], "revision": found["hf_revision"]}
    return rendered | {key: value for key, value in block.items() if key not in OWN_KEYS}


# --- what the draft costs (the memory planner) ---------------------------------------------------------------
# MTP loads the checkpoint's own MTP layers as the draft (hf_model_figures measures them apart: mtp_layers,
# mtp_weight_bytes), each an attention layer of the model's shape with its own KV cache. A draft model brings its
# own weights and attention layers (speculative.draft.architecture). The planner counts the draft's layers as
# more full-attention layers of the model's shape, which is what vLLM lays out when the shapes agree (one KV
# page size); a draft of another attention shape is refused rather than guessed. ngram, ngram_gpu and suffix
# propose from the text and cost no memory.
DRAFT_ARCHITECTURE_COUNTS = ("attention_layers", "kv_heads", "head_dim")


def draft_plan_problems(recipe: Mapping, label: str) -> list[str]:
    """What the planner needs to count the draft, with the fix; [] without speculation or for a method that
    costs nothing. The block's own shape is problems()' business."""
    block = recipe.get("speculative")
    method = block.get("method") if isinstance(block, Mapping) else None
    if not isinstance(method, str) or method in NO_MODEL:
        return []
    architecture = recipe.get("architecture") or {}
    where = f"{label}.speculative"
    if method == "mtp":
        missing = [key for key in ("mtp_layers", "mtp_weight_bytes") if not _positive(architecture.get(key))]
        if missing:
            return [
                f"{label}.architecture.{' and '.join(missing)}: MTP loads the checkpoint's MTP layers as its draft, "
                "and the planner counts their weights and KV cache: run library/hf_model_figures at the pinned "
                "revision (it reports mtp_layers and mtp_weight_bytes apart) and copy them into the architecture"
            ]
        return []
    if method == "dspark":
        return [f"{where}.method='dspark': the memory planner cannot count its draft yet; use mtp or a draft model"]
    draft_block = block.get("draft")
    figures = draft_block.get("architecture") if isinstance(draft_block, Mapping) else None
    if not isinstance(figures, Mapping):
        return [
            f"{where}.draft.architecture is missing: the planner counts the draft's weights and KV cache; give "
            "weight_bytes, attention_layers, kv_heads and head_dim (library/hf_model_figures measures them)"
        ]
    found = [
        f"{where}.draft.architecture.{key}={figures.get(key)!r}: expected a positive "
        f"{'number' if key == 'weight_bytes' else 'integer'}"
        for key in ("weight_bytes", *DRAFT_ARCHITECTURE_COUNTS)
        if not _positive(figures.get(key), integer=key != "weight_bytes")
    ]
    if found:
        return found
    kind = architecture.get("attention_kind", "full")
    if kind != "full":
        return [f"{where}.draft: the planner counts a draft model only beside a full-attention model, not {kind}"]
    mine = (architecture.get("kv_heads"), architecture.get("head_dim"))
    theirs = (figures["kv_heads"], figures["head_dim"])
    if mine != theirs:
        return [
            f"{where}.draft.architecture: {theirs[0]} KV heads of {theirs[1]} differ from the model's {mine[0]} of "
            f"{mine[1]}; the planner counts a draft only with the model's attention shape (one KV page size)"
        ]
    return []


def _positive(value: object, integer: bool = True) -> bool:
    if isinstance(value, bool):
        return False
    return (isinstance(value, int) if integer else isinstance(value, (int, float))) and value > 0


def draft_figures(recipe: Mapping) -> tuple[float, int]:
    """(weight bytes, attention layers of the model's shape) the draft of a checked recipe adds; (0, 0) without."""
    block = recipe.get("speculative")
    method = block.get("method") if isinstance(block, Mapping) else None
    if method == "mtp":
        architecture = recipe["architecture"]
        return float(architecture["mtp_weight_bytes"]), int(architecture["mtp_layers"])
    figures = (block or {}).get("draft", {}).get("architecture") if method not in (None, *NO_MODEL) else None
    if isinstance(figures, Mapping):
        return float(figures["weight_bytes"]), int(figures["attention_layers"])
    return 0.0, 0
