"""Model revisions locked like the image: a recipe (or a vllm_server_models entry) without a pinned commit names a
branch (`hf_branch`, default main); the controller resolves it once through the Hub API and writes the commit to a
models lock file beside the inventory, and every later run and every Spark serves that commit until the user asks
to move (vllm_server_models_update).

Which commit a model serves, in this order (the one place the precedence lives):
1. an explicit `hf_revision` commit, in the entry or the recipe;
2. the lock's entry for the repository and branch;
3. the branch resolved now through the Hub (or the mirror an air-gapped site sets), then written to the lock.

The lock file (YAML, commit it with the inventory):

    models:
      Qwen/Qwen3-0.6B@main:
        commit: c1899de289a04d12100db370d81485cdf75e47ca
        previous_commit: null        # the commit before the last move, for the record
        locked_at: "2026-12-04T10:00:00Z"
        figures: {weight_bytes: 1503300328, ...}   # the architecture hf_model_figures measured at that commit

Measured figures: when a commit is locked, the controller measures it (module_utils/hf_model_measure.py, what
hf_model_figures runs) and the lock keeps the architecture block. The planner then uses the measured values of the
keys the recipe states over the recipe's estimates (an entry's own architecture override still wins), and says so
where weight_bytes differ by more than FIGURES_TOLERANCE.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping

from ansible.module_utils import input_rules

DEFAULT_BRANCH = "main"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
ENTRY_KEYS = ("commit", "previous_commit", "locked_at", "figures")
# How far measured weight bytes may differ from a recipe's estimate before the plan says so.
FIGURES_TOLERANCE = 0.03
FIX = "restore the file from version control, or remove the entry (or the file) to lock the branch afresh"
HEADER = (
    "# The commit each model's branch was resolved to, written by sparkfleet (module_utils/model_lock.py): every\n"
    "# Spark serves these until vllm_server_models_update=true moves them. Commit it with the inventory.\n"
)


def lock_key(repo: str, branch: str) -> str:
    return f"{repo}@{branch}"


def wanted(recipe: Mapping) -> tuple[str, str] | None:
    """(repository, branch) when the recipe has no commit of its own and so follows a branch; None when its
    hf_revision is an explicit commit (which wins) or the recipe names no repository to resolve."""
    if input_rules.hf_commit(recipe.get("hf_revision")) is None:
        return None
    repo = recipe.get("hf_repo")
    if recipe.get("hf_revision") not in (None, "") or input_rules.hf_repo(repo) is not None:
        return None  # a malformed revision or repository: the recipe's own check names it
    return str(repo), str(recipe.get("hf_branch") or DEFAULT_BRANCH)


def with_locked_revision(recipe: dict, revisions: Mapping[str, str]) -> dict:
    """The recipe with the commit its branch is locked to, when it follows a branch and the lock has it."""
    follows = wanted(recipe)
    if follows is None or lock_key(*follows) not in revisions:
        return recipe
    return {**recipe, "hf_revision": revisions[lock_key(*follows)]}


def branch_problems(recipe: Mapping, label: str) -> list[str]:
    """The optional hf_branch key: a branch or tag name, meaningful only without a commit."""
    if "hf_branch" not in recipe:
        return []
    branch = recipe["hf_branch"]
    why = input_rules.hf_revision(branch) if isinstance(branch, str) else "is not a branch name"
    if why is not None or input_rules.hf_commit(branch) is None:
        reason = why or "a commit belongs in hf_revision"
        return [f"{label}.hf_branch={branch!r}: expected a branch or tag of the repository, e.g. main ({reason})"]
    return []


def lock_problems(lock: object) -> list[str]:
    """Every way a lock read from its file departs from what this module writes, each with the fix."""
    if lock in (None, {}):
        return []
    if not isinstance(lock, Mapping) or set(lock) - {"models"}:
        return [
            f"the file holds {type(lock).__name__} {sorted(lock) if isinstance(lock, Mapping) else ''}, "
            f"expected a mapping with one key, models; {FIX}"
        ]
    models = lock.get("models") or {}
    if not isinstance(models, Mapping):
        return [f"models is {type(models).__name__}, expected a mapping of REPO@BRANCH to an entry; {FIX}"]
    problems = []
    for key, entry in models.items():
        where = f"models[{key!r}]"
        repo, _, branch = str(key).rpartition("@")
        if input_rules.hf_repo(repo) is not None or input_rules.hf_revision(branch) is not None:
            problems.append(f"{where}: the key must be REPO@BRANCH, e.g. Qwen/Qwen3-0.6B@main; {FIX}")
            continue
        if not isinstance(entry, Mapping):
            problems.append(f"{where} is {type(entry).__name__}, expected a mapping of {', '.join(ENTRY_KEYS)}; {FIX}")
            continue
        problems += [f"{where}.{name} is not a key of a lock entry; {FIX}" for name in entry if name not in ENTRY_KEYS]
        if input_rules.hf_commit(entry.get("commit")) is not None:
            problems.append(f"{where}.commit={entry.get('commit')!r}: expected a commit of 40 hex digits; {FIX}")
        previous = entry.get("previous_commit")
        if previous is not None and input_rules.hf_commit(previous) is not None:
            problems.append(f"{where}.previous_commit={previous!r}: expected a commit or null; {FIX}")
        if "figures" in entry and not isinstance(entry["figures"], Mapping):
            problems.append(f"{where}.figures is {type(entry['figures']).__name__}, expected a mapping; {FIX}")
        if not locked_at_ok(entry.get("locked_at")):
            problems.append(f"{where}.locked_at={entry.get('locked_at')!r}: expected YYYY-MM-DDTHH:MM:SSZ; {FIX}")
    return problems


def locked_at_ok(value: object) -> bool:
    """A lock time as written (quoted text), or as YAML reads it back unquoted after a hand edit (a datetime)."""
    return isinstance(value, datetime.datetime) or TIMESTAMP.match(str(value)) is not None


def locked_commits(lock: Mapping | None) -> dict[str, str]:
    """REPO@BRANCH -> commit of a checked lock."""
    return {str(key): entry["commit"] for key, entry in ((lock or {}).get("models") or {}).items()}


def locked_figures(lock: Mapping | None) -> dict[str, dict]:
    """REPO@BRANCH -> the architecture measured at the locked commit, for the entries that have one."""
    models = (lock or {}).get("models") or {}
    return {str(key): dict(entry["figures"]) for key, entry in models.items() if entry.get("figures")}


def moved_entry(old: Mapping | None, commit: str, now: str) -> dict:
    """The lock entry after resolving `commit`: unchanged when it is the locked one, else the new commit with the
    old one kept as previous_commit (and no figures: they belonged to the old commit)."""
    if old and old.get("commit") == commit:
        return dict(old)
    return {"commit": commit, "previous_commit": (old or {}).get("commit"), "locked_at": now}


# Figures the planner reads that a recipe need not state: the lock's measurement supplies them.
MEASURED_OPTIONAL = ("attention_heads", "full_attention_kv_heads", "full_attention_head_dim")


def measured_architecture(
    recipe: Mapping, figures: Mapping[str, Mapping], label: str, own: Mapping | None = None
) -> tuple[dict, list[str]]:
    """The architecture override the lock's measured figures make for a recipe that follows a branch: the measured
    values of the keys the recipe states, less those the entry sets itself (`own`, which win), and a note where
    weight_bytes differ from the recipe's estimate by more than FIGURES_TOLERANCE. ({}, []) without figures."""
    follows = wanted(recipe)
    measured = figures.get(lock_key(*follows)) if follows else None
    stated = recipe.get("architecture")
    if not measured or not isinstance(stated, Mapping):
        return {}, []
    own = own if isinstance(own, Mapping) else {}
    # The keys the recipe states, and those the planner reads that a recipe may leave out (attention_heads).
    keys = [*stated, *(key for key in MEASURED_OPTIONAL if key not in stated)]
    override = {key: measured[key] for key in keys if key in measured and measured[key] is not None and key not in own}
    notes = []
    estimate, found = stated.get("weight_bytes"), override.get("weight_bytes")
    numbers = all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in (estimate, found))
    if numbers and estimate > 0 and abs(found - estimate) / estimate > FIGURES_TOLERANCE:
        notes.append(
            f"{label}: the plan uses weight_bytes measured at the locked commit of {lock_key(*follows)}, "
            f"{found / 1e9:.2f} GB, over the recipe's estimate, {estimate / 1e9:.2f} GB "
            f"({(found - estimate) / estimate:+.0%})"
        )
    return override, notes
