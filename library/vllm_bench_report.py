#!/usr/bin/python
"""Ansible module vllm_bench_report: write vllm_bench's results as JSON, CSV and a sweep plot (on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench_report
short_description: Write vllm_bench results to results.json, results.csv and sweep.png in a directory
description:
  - Writes RV(vllm_bench.measurements) as C(results.json), as C(results.csv) (one row per scenario, then one per
    sweep level, a C(section) column first) and, when there was a sweep, as C(sweep.png) (aggregate output
    tok/s, p95 TTFT and p50 inter-token latency against concurrency, the knee marked).
  - With O(arena) (what M(vllm_bench_arena) returned), also C(arena.json) (its profile, rows and llama-benchy's
    own reports), C(arena.csv) (one row per depth and concurrency) and C(arena.png) (decode and prefill tok/s
    against context depth, a line per concurrency level).
  - Meant for the controller (C(delegate_to) C(localhost)); the plot needs matplotlib, a controller dependency
    in requirements.txt, which a Spark does not need.
  - Writes a file only when its content differs, and reports a change only then; in check mode it writes
    nothing and reports what it would change.
version_added: "0.1.0"
author: sparkfleet
options:
  measurements:
    description: The C(measurements) that M(vllm_bench) returned.
    type: dict
    required: true
  arena:
    description: The C(arena) that M(vllm_bench_arena) returned.
    type: dict
  compare_with:
    description:
      - A variant of this model's results measured earlier (e.g. C(speculation-off)), in the folder of that name
        inside O(dest). Its scenarios are set beside these in RV(comparison) and in C(results.json). When none
        was measured there is no comparison, and RV(comparison) is null.
    type: str
  compare_since:
    description:
      - With O(compare_with), compare only with a variant measured at or after this time (YYYY-MM-DDTHH:MM:SSZ,
        UTC), e.g. the start of the run that measured it; an older one, left from an earlier run, is not compared
        (with a warning). Empty - any time.
    type: str
    default: ""
  dest:
    description: Directory to write into; created (with its parents) when missing.
    type: path
    required: true
  mode:
    description: Permissions of the written files.
    type: raw
    default: "0644"
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Write the bench report next to the playbook
  vllm_bench_report:
    measurements: "{{ bench.measurements }}"
    dest: "{{ playbook_dir }}/reports/{{ inventory_hostname }}"
  delegate_to: localhost
"""

RETURN = r"""
files:
  description: Paths of the report's files (sweep.png only when there was a sweep, the arena files only with
    O(arena)).
  returned: always
  type: dict
  sample: {"json": "/r/results.json", "csv": "/r/results.csv", "png": "/r/sweep.png", "arena_png": "/r/arena.png"}
comparison:
  description:
    - With O(compare_with) measured, each scenario beside that variant's run of it (decode, TTFT, total time,
      decode_speedup, this run's acceptance); C(unmatched) lists the scenarios the variant did not measure.
  returned: always
  type: dict
  sample: {"variant": "speculation-off", "variant_measured_at": "2026-12-04T10:00:00Z", "unmatched": [],
           "rows": [{"scenario": "short prompt, long gen", "decode_tok_s": 62.6, "variant_decode_tok_s": 43.0,
                     "decode_speedup": 1.456}]}
changed_files:
  description: Paths whose content was (or, in check mode, would be) written.
  returned: always
  type: list
  elements: str
"""

import re
from pathlib import Path

from ansible.module_utils.arena_bench import arena_csv, arena_json, arena_png
from ansible.module_utils.atomic_file import write_bytes_atomically
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bench_compare import comparison, measured_since, read_variant
from ansible.module_utils.openai_bench import results_csv, results_json, sweep_png

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def report_files(results: dict, arena: dict | None) -> dict[str, tuple[str, bytes]]:
    """kind -> (file name, content) of every file the report holds."""
    files = {
        "json": ("results.json", results_json(results).encode()),
        "csv": ("results.csv", results_csv(results).encode()),
    }
    png = sweep_png(results)
    if png is not None:
        files["png"] = ("sweep.png", png)
    if arena:
        files["arena_json"] = ("arena.json", arena_json(arena).encode())
        files["arena_csv"] = ("arena.csv", arena_csv(arena).encode())
        files["arena_png"] = ("arena.png", arena_png(arena, str(results.get("model"))))
    return files


def differs(path: Path, content: bytes) -> bool:
    return not path.is_file() or path.read_bytes() != content


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "measurements": {"type": "dict", "required": True},
            "arena": {"type": "dict"},
            "compare_with": {"type": "str"},
            "compare_since": {"type": "str", "default": ""},
            "dest": {"type": "path", "required": True},
            "mode": {"type": "raw", "default": "0644"},
        },
        supports_check_mode=True,
    )
    dest = Path(module.params["dest"])
    results = module.params["measurements"]
    if not isinstance(results.get("scenarios"), list):
        module.fail_json(msg="measurements has no 'scenarios' list: pass the 'measurements' vllm_bench returned")
    compared = None
    if module.params["compare_with"]:
        try:
            variant = read_variant(dest, module.params["compare_with"])
        except (OSError, ValueError) as error:
            module.fail_json(msg=f"cannot read the {module.params['compare_with']} results to compare with: {error}")
        since = module.params["compare_since"]
        if since and not TIMESTAMP.match(since):
            module.fail_json(msg=f"compare_since={since!r}: expected a UTC time as YYYY-MM-DDTHH:MM:SSZ, or empty")
        if variant is not None and not measured_since(variant, since):
            module.warn(
                f"the {module.params['compare_with']} results in {dest} were measured at "
                f"{variant.get('measured_at')}, before this run ({since}): not compared"
            )
            variant = None
        if variant is not None:
            compared = comparison(results["scenarios"], variant, module.params["compare_with"])
            results = {**results, "comparison": compared}
    try:
        files = report_files(results, module.params["arena"])
    except ImportError as error:
        module.fail_json(msg=f"cannot draw the plots: {error}; install the controller's requirements.txt")
    paths = {kind: str(dest / name) for kind, (name, _) in files.items()}
    changed_files = [str(dest / name) for name, content in files.values() if differs(dest / name, content)]
    changed = bool(changed_files)
    if not module.check_mode:
        dest.mkdir(parents=True, exist_ok=True)
        for name, content in files.values():
            if str(dest / name) in changed_files:
                # Beside the target, then renamed; its mode (0600 until then) is set just below.
                write_bytes_atomically(dest / name, content, mode=None, folder_mode=None)
            file_args = module.load_file_common_arguments({"path": str(dest / name), "mode": module.params["mode"]})
            changed = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(changed=changed, files=paths, changed_files=changed_files, comparison=compared)


if __name__ == "__main__":
    main()
