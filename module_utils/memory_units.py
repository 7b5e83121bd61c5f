"""Units and rounding that the memory rules share: bytes in a GiB, a GiB figure for a message, and a fraction
rounded to hundredths (a gpu_memory_utilization step).

Standard library only, and imported by nothing but the memory rules (module_utils/memory_plan.py,
module_utils/vllm_start_check.py), so that the start check ships to a Spark with its guard (module_utils/vllm_guard.py)
without the planner.
"""

from __future__ import annotations

import math

GIB = 2**30


def hundredths(value: float, up: bool) -> float:
    """`value` rounded up or down to 0.01, ignoring float noise below a millionth of a step."""
    steps = round(value * 100, 6)
    return (math.ceil(steps) if up else math.floor(steps)) / 100


def gib_text(value: float) -> str:
    """Bytes as GiB for a message: '12.3 GiB'."""
    return f"{value / GIB:,.1f} GiB"
