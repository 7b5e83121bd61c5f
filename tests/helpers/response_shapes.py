"""The shape of a JSON answer, and where two shapes differ: how the stand-in vLLM is held to the real engine.

shape() keeps what a client can rely on and drops what changes from run to run: the keys of every object, and for
every value its JSON type ("str", "int", "float", "bool", "null"); a list is the shapes its items take. differences()
walks two shapes together and names each path where they part, as "a.b[].c". The contract test compares the
stand-in's answers with the real engine's this way and lists, with a reason, each difference it allows.
"""

from __future__ import annotations

from typing import Any

JSON_TYPES = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"), (type(None), "null"))


def shape(value: Any) -> Any:
    """Keys and JSON types of `value`; a number that is whole in one answer and not in another is one "number"."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        kinds: list[Any] = []
        for item in value:
            found = shape(item)
            if found not in kinds:
                kinds.append(found)
        return kinds
    for kind, name in JSON_TYPES:
        if isinstance(value, kind):
            return "number" if name in ("int", "float") else name
    raise TypeError(f"not a JSON value: {value!r}")


def _merge(kinds: list[Any]) -> Any:
    """The items of a list as one shape: objects merged key by key, else the first item's shape."""
    objects = [kind for kind in kinds if isinstance(kind, dict)]
    if not objects:
        return kinds[0] if kinds else None
    merged: dict[str, Any] = {}
    for kind in objects:
        for key, item in kind.items():
            merged.setdefault(key, item)
    return merged


def differences(real: Any, standin: Any, path: str = "") -> list[str]:
    """Every path where the stand-in's shape parts from the real engine's, one line each."""
    if isinstance(real, dict) and isinstance(standin, dict):
        found = []
        for key in sorted(set(real) | set(standin)):
            where = f"{path}.{key}" if path else key
            if key not in standin:
                found.append(f"{where}: only in the real engine ({real[key]!r})")
            elif key not in real:
                found.append(f"{where}: only in the stand-in ({standin[key]!r})")
            else:
                found += differences(real[key], standin[key], where)
        return found
    if isinstance(real, list) and isinstance(standin, list):
        if not real or not standin:
            return []  # an empty list says nothing about its items' shape
        return differences(_merge(real), _merge(standin), f"{path}[]")
    if real != standin:
        return [f"{path}: the real engine sends {real!r}, the stand-in {standin!r}"]
    return []
