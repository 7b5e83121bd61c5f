"""One bench run's scenarios beside a variant's, measured earlier on the same Spark and model under other settings
(acceptance.yml's "speculation-off": the same scenarios served without the recipe's speculative decoding).

A variant's results sit in a folder of their own below the model's (vllm_bench_variant), so they never replace the
usual ones; a later run names it (vllm_bench_compare_with) and its report sets the two side by side. Scenarios are
matched by name and by their exact prompt and output lengths: a scenario measured at other lengths is not the same
measurement and is listed as unmatched instead.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS_FILE = "results.json"


def variant_folder(model_folder: str | Path, variant: str) -> Path:
    """Where a variant's results of one model go: a folder named after it inside the model's own."""
    return Path(model_folder) / variant


def read_variant(model_folder: str | Path, variant: str) -> dict | None:
    """The variant's results.json beside this model's, or None when it was never measured."""
    path = variant_folder(model_folder, variant) / RESULTS_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def measured_since(variant_results: dict, since: str) -> bool:
    """Whether the variant was measured at or after `since` (YYYY-MM-DDTHH:MM:SSZ, which sorts as text); any time
    when `since` is empty. A variant left from an earlier run (another image, another commit) is not compared."""
    return not since or str(variant_results.get("measured_at") or "") >= since


def _key(row: dict) -> tuple:
    return (row.get("scenario"), row.get("prompt_tokens"), row.get("output_tokens"))


def _ratio(value: object, reference: object) -> float | None:
    numbers = isinstance(value, (int, float)) and isinstance(reference, (int, float))
    return round(value / reference, 3) if numbers and reference > 0 else None


def comparison(scenarios: list[dict], variant_results: dict, variant: str) -> dict:
    """Each of this run's scenarios beside the variant's run of it: decode, TTFT and total time under both, and
    how many times faster this run decodes (decode_speedup > 1: this run is faster)."""
    theirs = {_key(row): row for row in variant_results.get("scenarios") or []}
    rows, unmatched = [], []
    for row in scenarios:
        other = theirs.get(_key(row))
        if other is None:
            unmatched.append(row["scenario"])
            continue
        rows.append(
            {
                "scenario": row["scenario"],
                "prompt_tokens": row["prompt_tokens"],
                "output_tokens": row["output_tokens"],
                "variant_ttft_s": other.get("ttft_s"),
                "ttft_s": row.get("ttft_s"),
                "variant_total_s": other.get("total_s"),
                "total_s": row.get("total_s"),
                "variant_decode_tok_s": other.get("decode_tok_s"),
                "decode_tok_s": row.get("decode_tok_s"),
                "decode_speedup": _ratio(row.get("decode_tok_s"), other.get("decode_tok_s")),
                "spec_acceptance_rate": row.get("spec_acceptance_rate"),
                "spec_accepted_length": row.get("spec_accepted_length"),
            }
        )
    return {
        "variant": variant,
        "variant_measured_at": variant_results.get("measured_at"),
        "rows": rows,
        "unmatched": unmatched,
    }
