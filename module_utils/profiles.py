"""Decision profiles: the seed's closing table as a per-entry choice (`profile: speed | users | safe` in a
vllm_server_models entry; none: the recipe's own settings). The planner derives the four planned values, the KV
cache dtype and speculation for the profile with the same memory rules it checks every recipe by:

- speed: one stream at the model's full context (architecture.max_context), speculation kept where the recipe has
  it, at the smallest safe share that holds that one sequence; when no safe share holds the full context, the
  longest context the largest safe share holds;
- users: the most concurrent sequences at a stated context (the entry's profile_context, else the recipe's
  max_model_len capped at USERS_CONTEXT), FP8 KV cache where the model's attention takes it, no speculation (its
  draft costs KV cache and its gain shrinks as the batch grows), at the largest safe share;
- safe: the largest headroom the model still fits with: the recipe's context, KV dtype and sequences (as many as
  the share holds), no speculation, at the smallest safe share that holds one full-length sequence.

Each choice comes with why, the single-stream decode ceiling (the bytes a decoded token reads over the ~231 GB/s
a Spark measures) and the published figure where the recipe has one, so that a user sees what a profile buys
before the download.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import replace

from ansible.module_utils.memory_plan import (
    CONTEXT_STEP,
    build_inputs,
    decode_bound_tok_s,
    hundredths,
    largest_safe_utilization,
    longest_sequence_tokens,
    safe_utilization_holding,
    sequences_held,
)
from ansible.module_utils.recipe_rules import plan_problems

PROFILES = ("speed", "users", "safe")


# The users profile's context when the entry states none: the recipe's, at most this many tokens.
USERS_CONTEXT = 32768
# The most sequences the users profile asks vLLM to run at once (vLLM's own --max-num-seqs default is 256).
MAX_USERS = 256
# A Spark's measured memory bandwidth, GB/s (spark-facts.md: about 231-234 GB/s of the 273 GB/s LPDDR5X peak).
MEASURED_BANDWIDTH_GB_S = 231.0
# The FP8 KV cache dtype the users profile asks for.
FP8_KV = "fp8"


# What each profile chooses: an entry that names a profile leaves these to it (the others it takes from the entry).
CHOSEN_KEYS = {
    "speed": ("gpu_memory_utilization", "max_model_len", "max_num_seqs"),
    "users": ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "kv_cache_dtype", "speculative"),
    "safe": ("gpu_memory_utilization", "speculative"),
}


def entry_problems(entry: Mapping, label: str, recipe: Mapping | None = None) -> list[str]:
    """An entry's profile and profile_context, each with the fix; with the checked recipe, the context is held to
    the model's own."""
    problems = []
    profile = entry.get("profile")
    if profile is not None and profile not in PROFILES:
        close = difflib.get_close_matches(str(profile), PROFILES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        problems.append(f"{label}.profile={profile!r}: expected one of {', '.join(PROFILES)}, or none{hint}")
    if profile in CHOSEN_KEYS:
        for key in (key for key in CHOSEN_KEYS[profile] if key in entry):
            problems.append(
                f"{label}.{key}: profile {profile} chooses {key} itself; remove {key} from the entry, or remove "
                "the profile to set it yourself"
            )
    context = entry.get("profile_context")
    if context is not None:
        if profile != "users":
            problems.append(f"{label}.profile_context: only the users profile takes a context; remove it")
        elif isinstance(context, bool) or not isinstance(context, int) or context < 1:
            problems.append(f"{label}.profile_context={context!r}: expected a positive number of tokens, e.g. 16384")
        elif recipe is not None and context > recipe["architecture"]["max_context"]:
            problems.append(
                f"{label}.profile_context={context}: more than the model's context of "
                f"{recipe['architecture']['max_context']:,} tokens; set {recipe['architecture']['max_context']} "
                "or lower"
            )
    return problems


def _inputs(recipe: Mapping, memory_total_bytes: int, settings: Mapping, label: str):
    inputs, problems = build_inputs(recipe, memory_total_bytes=memory_total_bytes, name=label, **settings)
    return inputs, problems


def _without_speculation(recipe: Mapping) -> dict:
    return {key: value for key, value in recipe.items() if key != "speculative"}


def _largest_share(inputs, share_limit: float | None) -> float | None:
    """The largest safe share, within what the host's other models leave (share_limit, None: the host alone)."""
    largest = largest_safe_utilization(inputs)
    if largest is None or share_limit is None:
        return largest
    return min(largest, share_limit) if share_limit > 0 else None


def _speed(recipe: dict, memory_total_bytes: int, settings: Mapping, label: str, share_limit: float | None):
    context = recipe["architecture"]["max_context"]
    chosen = {**recipe, "max_num_seqs": 1, "max_model_len": context}
    inputs, problems = _inputs(chosen, memory_total_bytes, settings, label)
    if problems:
        return recipe, ""
    share = safe_utilization_holding(inputs, context)
    why = f"one stream at the full context of {context:,} tokens, at the smallest safe share that holds it"
    if share is None or (share_limit is not None and share > share_limit):
        share = _largest_share(inputs, share_limit)
        if share is None or longest_sequence_tokens(inputs, share) < CONTEXT_STEP:
            return recipe, ""
        longest = longest_sequence_tokens(inputs, share) // CONTEXT_STEP * CONTEXT_STEP
        chosen["max_model_len"] = max(longest, CONTEXT_STEP)
        why = (
            f"one stream at the longest context the largest safe share holds ({chosen['max_model_len']:,} of "
            f"the model's {context:,} tokens)"
        )
    if chosen.get("speculative"):
        why += ", with the recipe's speculative decoding"
    return {**chosen, "gpu_memory_utilization": share}, why


def _users(
    recipe: dict, memory_total_bytes: int, settings: Mapping, label: str, context: int | None, share_limit: float | None
):
    context = context or min(recipe["max_model_len"], USERS_CONTEXT)
    chosen = {**_without_speculation(recipe), "max_model_len": context}
    why_kv = "the recipe's KV cache dtype"
    fp8 = {**chosen, "kv_cache_dtype": FP8_KV}
    if recipe["kv_cache_dtype"] != FP8_KV and not plan_problems(fp8, label):
        chosen, why_kv = fp8, "an FP8 KV cache (twice the sequences of a 16-bit one)"
    inputs, problems = _inputs(chosen, memory_total_bytes, settings, label)
    share = None if problems else _largest_share(inputs, share_limit)
    if share is None or sequences_held(inputs, share) < 1:
        return recipe, ""
    held = sequences_held(inputs, share)
    chosen = {**chosen, "gpu_memory_utilization": share, "max_num_seqs": min(held, MAX_USERS)}
    why = (
        f"the most concurrent {context:,}-token sequences ({chosen['max_num_seqs']}) at the largest safe share"
        f"{'' if share_limit is None else ' the host' + chr(39) + 's other models leave'}, {why_kv}, no speculative "
        "decoding"
    )
    return chosen, why


def _safe(recipe: dict, memory_total_bytes: int, settings: Mapping, label: str) -> tuple[dict, str]:
    chosen = _without_speculation(recipe)
    inputs, problems = _inputs(chosen, memory_total_bytes, settings, label)
    share = None if problems else safe_utilization_holding(inputs, recipe["max_model_len"])
    if share is None:
        return recipe, ""
    held = sequences_held(inputs, share)
    chosen = {**chosen, "gpu_memory_utilization": share, "max_num_seqs": max(1, min(recipe["max_num_seqs"], held))}
    why = (
        f"the largest headroom: the smallest safe share that holds one {recipe['max_model_len']:,}-token sequence, "
        f"{chosen['max_num_seqs']} sequence(s), no speculative decoding"
    )
    return chosen, why


def published_decode(recipe: Mapping) -> str | None:
    """The published single-stream decode figure of the model, with its source, where the recipe has one."""
    measured = recipe.get("measured") or {}
    if measured.get("decode_tok_s"):
        return f"{measured['decode_tok_s']:g} tok/s measured ({measured.get('source', 'source in the recipe')})"
    for key in ("published_arena", "published_eval"):
        block = recipe.get(key) or {}
        rows = [row for row in block.get("rows") or [] if row.get("decode_tok_s")]
        if rows:
            return (
                f"{rows[0]['decode_tok_s']:g} tok/s published ({key}: {' '.join(str(block.get('source', '')).split())})"
            )
    return None


def apply_profile(
    recipe: dict,
    entry: Mapping,
    *,
    memory_total_bytes: int,
    settings: Mapping,
    label: str,
    share_limit: float | None = None,
) -> tuple[dict, list[str]]:
    """The checked recipe with the entry's profile applied, and the note that says what was chosen and why; the
    recipe as it is (and no note) without a profile. share_limit is the largest share the host's other models
    leave this one (profiles_for_host), None when it is the host's only model. A profile that finds no safe share
    leaves the recipe to the planner, whose refusal names the fix."""
    profile = entry.get("profile")
    if profile is None:
        return recipe, []
    if profile == "speed":
        chosen, why = _speed(recipe, memory_total_bytes, settings, label, share_limit)
    elif profile == "users":
        chosen, why = _users(recipe, memory_total_bytes, settings, label, entry.get("profile_context"), share_limit)
    else:
        chosen, why = _safe(recipe, memory_total_bytes, settings, label)
    if not why:
        beside = "" if share_limit is None else f" within the {share_limit:.2f} share the host's other models leave"
        return recipe, [
            f"{label}: profile {profile} found no safe share for this model{beside}; the recipe's settings stand"
        ]
    inputs, _ = _inputs(chosen, memory_total_bytes, settings, label)
    ceiling = decode_bound_tok_s(replace(inputs, bandwidth_gb_s=MEASURED_BANDWIDTH_GB_S))
    note = (
        f"{label}: profile {profile}: gpu_memory_utilization {chosen['gpu_memory_utilization']:.2f}, max_model_len "
        f"{chosen['max_model_len']:,}, max_num_seqs {chosen['max_num_seqs']}, kv_cache_dtype "
        f"{chosen['kv_cache_dtype']}, speculative decoding {'on' if chosen.get('speculative') else 'off'} ({why}); "
        f"one stream decodes at most {ceiling:,.1f} tok/s ({MEASURED_BANDWIDTH_GB_S:g} GB/s over the bytes a token "
        "reads)"
    )
    published = published_decode(recipe)
    note += f"; {published}" if published else "; no published figure for this model"
    return chosen, [note]


# The profiles that take the largest share there is: on a host with other models, they share what is left.
FILLING = ("users",)


def profiles_for_host(
    checked: list[tuple[Mapping, dict]], *, memory_total_bytes: int, settings: Mapping, labels: list[str]
) -> tuple[list[dict], list[str]]:
    """Every entry of one host with its profile applied, and the notes. Entries without a profile and those whose
    profile takes the least share it can (speed, safe) come first; a filling profile (users) then takes the largest
    safe share for the host's sum less the others' shares, split evenly when several fill."""
    results: list[dict | None] = [None] * len(checked)
    notes: dict[int, list[str]] = {}
    alone = len(checked) == 1
    for index, (entry, recipe) in enumerate(checked):
        if entry.get("profile") not in FILLING:
            results[index], notes[index] = apply_profile(
                recipe, entry, memory_total_bytes=memory_total_bytes, settings=settings, label=labels[index]
            )
    filling = [index for index, result in enumerate(results) if result is None]
    share_limit = None
    if filling and not alone:
        # Every entry of the host has the same pool and settings: the limit for one share is the limit for the sum.
        entry, recipe = checked[filling[0]]
        inputs, problems = _inputs(recipe, memory_total_bytes, settings, labels[filling[0]])
        host_limit = None if problems else largest_safe_utilization(inputs)
        taken = sum(result["gpu_memory_utilization"] for result in results if result is not None)
        share_limit = 0.0 if host_limit is None else hundredths((host_limit - taken) / len(filling), up=False)
    for index in filling:
        entry, recipe = checked[index]
        results[index], notes[index] = apply_profile(
            recipe,
            entry,
            memory_total_bytes=memory_total_bytes,
            settings=settings,
            label=labels[index],
            share_limit=share_limit,
        )
    return results, [note for index in range(len(checked)) for note in notes[index]]
