"""Jinja filter for roles/vllm_server: `MODELS | vllm_unit_images(SERVER_IMAGE, PINNED_ID, PINNED_REF)`, each served
model with the image its container runs and how people see it.

The rule (a recipe's image, else vllm_server_image, else the image vllm_image pinned, by ID) is
module_utils/unit_restarts.py's unit_image, the module that decides the restarts reads the same file; it is loaded from
that file, since a controller plugin cannot import the project's module_utils as a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "sparkfleet_unit_restarts", Path(__file__).resolve().parents[1] / "module_utils" / "unit_restarts.py"
)
vllm_units = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vllm_units)


def vllm_unit_images(models: list[dict], server_image: str = "", pinned_id: str = "", pinned_ref: str = "") -> list:
    """Each model with `image` and `image_shown` (module_utils/unit_restarts.py: unit_image)."""
    return vllm_units.with_images(
        list(models),
        server_image=server_image or "",
        pinned_image_id=pinned_id or "",
        pinned_image_ref=pinned_ref or "",
    )


class FilterModule:
    def filters(self) -> dict:
        return {"vllm_unit_images": vllm_unit_images}
