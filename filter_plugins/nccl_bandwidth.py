"""Jinja filter for the fabric's bandwidth gate (module_utils/nccl_bandwidth.py, the one definition of the rule,
loaded from that file since a controller plugin cannot import the project's module_utils as a package):

- `OUTPUT | nccl_bandwidth_judge(MIN_GBS, GROUP)`: {passed, busbw, message, largest, average_busbw, collective} for
  a bandwidth test's output (nccl-tests format) against MIN_GBS;
- `VERDICT | nccl_bandwidth_metrics(GROUP, MIN_GBS, MEASURED_AT)`: that verdict as node_exporter textfile metrics.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_nccl_bandwidth", Path(__file__).resolve().parents[1] / "module_utils" / "nccl_bandwidth.py"
)
nccl_bandwidth_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nccl_bandwidth_rules)


def nccl_bandwidth_judge(output: str, min_busbw_gbs: float, group: str) -> dict:
    result = nccl_bandwidth_rules.parse(str(output or ""))
    verdict = nccl_bandwidth_rules.judge(result, float(min_busbw_gbs), str(group))
    return {
        **verdict,
        "largest": result["largest"],
        "average_busbw": result["average_busbw"],
        "collective": result["collective"],
    }


def nccl_bandwidth_metrics(result: dict, group: str, min_busbw_gbs: float, measured_at: float) -> str:
    return nccl_bandwidth_rules.textfile_metrics(
        str(group), result.get("busbw"), float(min_busbw_gbs), bool(result.get("passed")), float(measured_at)
    )


class FilterModule:
    def filters(self) -> dict:
        return {"nccl_bandwidth_judge": nccl_bandwidth_judge, "nccl_bandwidth_metrics": nccl_bandwidth_metrics}
