#!/usr/bin/env python3
"""Regenerate the vLLM contract files from a real vLLM release: run with the python of a venv that has it.

    python3 -m venv /tmp/vllm-venv && VLLM_TARGET_DEVICE=cpu /tmp/vllm-venv/bin/pip install vllm==0.33.0
    /tmp/vllm-venv/bin/python tests/contracts/vllm/regenerate.py 0.33.0

(about 6 GB, outside the repository; `bash tests/contracts/vllm/regenerate.sh 0.33.0` does both steps). vLLM's
PyPI wheel imports and answers `--help` on a CPU-only machine with VLLM_TARGET_DEVICE=cpu; nothing is served.
It writes, each with the release in its header:
  recipes/vllm-serve-flags.txt              the flags of `vllm serve` (preflight checks every recipe flag on it)
  tests/contracts/vllm/serve-help-all.txt   `vllm serve --help=all` as printed (the stand-in vLLM prints it)
  tests/contracts/vllm/openai-schemas.json  JSON schemas of the responses sparkfleet reads, from vLLM's pydantic
  tests/contracts/vllm/metrics.json         every Prometheus metric vLLM defines, with its type and file
  tests/contracts/vllm/kv-cache-plans.json  vLLM's own KV cache plan for every recipe and test shape
                                            (kv_cache_plans.py: its real spec classes and planning functions)
  recipes/vllm-speculative-config.json      SpeculativeConfig's methods and keys (preflight checks a recipe's
                                            `speculative` block on it)
The flag list is read from the help text by module_utils/vllm_flags.py, the same reader the Spark runs on the
pinned image's own help; this script then checks that reading against the parser's own actions, so a help
format the reader gets wrong fails here instead of in a user's preflight. CI never installs vLLM: the
committed files are the contract the tests check the stand-in and the dashboards against.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "module_utils"))
from vllm_flags import parse_serve_help, render_flag_list  # noqa: E402 -- importable once module_utils is on the path

sys.path.insert(0, str(HERE))
from kv_cache_plans import write_contract  # noqa: E402 -- beside this script

# The responses sparkfleet and its tests read, by the name the contract gives them.
SCHEMAS = {
    "chat_completion": "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionResponse",
    "chat_completion_chunk": "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionStreamResponse",
    "completion": "vllm.entrypoints.openai.completion.protocol:CompletionResponse",
    "completion_chunk": "vllm.entrypoints.openai.completion.protocol:CompletionStreamResponse",
    "models": "vllm.entrypoints.serve.engine.protocol:ModelList",
    "error": "vllm.entrypoints.serve.engine.protocol:ErrorResponse",
    "tokenize": "vllm.entrypoints.serve.tokenize.protocol:TokenizeResponse",
    "embedding": "vllm.entrypoints.pooling.embed.protocol:EmbeddingResponse",
    "rerank": "vllm.entrypoints.pooling.scoring.protocol:RerankResponse",
}
METRIC_KINDS = {"gauge": "gauge", "counter": "counter", "histogram": "histogram"}


def header(version: str, what: str) -> str:
    return (
        f"# Generated from vLLM {version} (PyPI wheel, VLLM_TARGET_DEVICE=cpu) by tests/contracts/vllm/regenerate.py:"
        f" {what}.\n# Do not edit by hand: run the script again for another release.\n"
    )


def serve_help(env: dict[str, str]) -> str:
    """`vllm serve --help=all` of the installed release, at a fixed width so the file is the same every time."""
    vllm = Path(sys.executable).with_name("vllm")
    done = subprocess.run(
        [str(vllm), "serve", "--help=all"], env=env, capture_output=True, text=True, check=True, timeout=600
    )
    return done.stdout


def parser_truth() -> dict[str, dict]:
    """Each long flag of the real parser: its kind as argparse sees it, and its choices."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    truth = {}
    for action in parser._actions:
        longs = [option for option in action.option_strings if option.startswith("--")]
        if not longs or longs[0] == "--help":
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "bool"
        elif action.nargs == 0:
            kind = "switch"
        elif action.nargs in ("+", "*"):
            kind = "many"
        elif action.nargs == "?":
            kind = "optional"
        else:
            kind = "value"
        truth[longs[0][2:]] = {"kind": kind, "choices": tuple(str(c) for c in action.choices or ())}
    return truth


def check_against_parser(flags: dict, truth: dict) -> list[str]:
    """Where the help reader and the parser disagree (json is a value to argparse)."""
    problems = [f"--{name}: in the parser, not read from the help" for name in sorted(set(truth) - set(flags))]
    problems += [f"--{name}: read from the help, not in the parser" for name in sorted(set(flags) - set(truth))]
    for name in sorted(set(flags) & set(truth)):
        read = "value" if flags[name].kind == "json" else flags[name].kind
        if read != truth[name]["kind"]:
            problems.append(f"--{name}: read as {flags[name].kind}, the parser has {truth[name]['kind']}")
        if truth[name]["choices"] and tuple(flags[name].choices) != truth[name]["choices"]:
            problems.append(f"--{name}: choices read {flags[name].choices}, the parser has {truth[name]['choices']}")
    return problems


def schemas() -> dict[str, dict]:
    import importlib

    out = {}
    for key, target in SCHEMAS.items():
        module, _, name = target.partition(":")
        model = getattr(importlib.import_module(module), name)
        out[key] = {"model": target, "schema": model.model_json_schema(mode="serialization")}
    return out


def guarded_prefixes() -> list[str]:
    """The paths --api-key guards: vLLM's AuthenticationMiddleware lets every other path through (/health,
    /metrics, /tokenize, /rerank, /score, ...)."""
    from vllm.entrypoints.serve.middleware.authenticate import GUARDED_PREFIX

    return list(GUARDED_PREFIX)


def metric_kind(call: ast.Call) -> str | None:
    """gauge/counter/histogram from calls like self._gauge_cls(...), prometheus_client.Counter(...)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return next((kind for word, kind in METRIC_KINDS.items() if word in name.lower()), None)


def _string_constants(tree: ast.AST) -> dict[str, set[str]]:
    """Each variable of a file assigned a literal "vllm:..." name: the names, by variable (a metric named through a
    variable, e.g. loggers.py `name = "vllm:cache_config_info"` then `self._gauge_cls(name=name, ...)`)."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, str) and value.startswith("vllm:"):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, set()).add(value)
    return found


def _looped_names(tree: ast.AST) -> dict[str, dict[str, str]]:
    """Each loop variable that takes metric names from a list of ("vllm:...", documentation) pairs: the names and
    their documentation, by variable (spec_decode/metrics.py: `counter_specs = [("vllm:spec_decode_num_drafts",
    "..."), ...]`, then `self._counter_cls(name=name, documentation=doc, ...) for name, doc in counter_specs`)."""
    lists: dict[str, dict[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            pairs = {}
            for item in node.value.elts:
                if isinstance(item, ast.Tuple) and len(item.elts) == 2:
                    name, doc = (element.value if isinstance(element, ast.Constant) else None for element in item.elts)
                    if isinstance(name, str) and name.startswith("vllm:"):
                        pairs[name] = doc
            for target in node.targets:
                if pairs and isinstance(target, ast.Name):
                    lists.setdefault(target.id, {}).update(pairs)
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(tree):
        loop = isinstance(node, (ast.comprehension, ast.For)) and isinstance(node.iter, ast.Name)
        if loop and node.iter.id in lists and isinstance(node.target, ast.Tuple):
            first = node.target.elts[0]
            if isinstance(first, ast.Name):
                found.setdefault(first.id, {}).update(lists[node.iter.id])
    return found


def exposed_name(name: str, kind: str) -> str:
    """The family name prometheus_client exposes: a counter's "_total" is its sample suffix, not part of the name
    (prometheus_client/metrics.py Counter: a name ending in _total loses it), so a counter defined as
    "vllm:estimated_flops_per_gpu_total" is the family vllm:estimated_flops_per_gpu, sampled as ..._total."""
    return name.removesuffix("_total") if kind == "counter" else name


def metrics() -> dict[str, dict]:
    """Every metric vLLM defines by name in its source, literal or through a variable that holds a literal name:
    the family as exposed on /metrics, its kind, help and file (and the name as written, where they differ)."""
    import vllm

    package = Path(vllm.__file__).parent
    found: dict[str, dict] = {}
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if '"vllm:' not in text:
            continue
        tree = ast.parse(text)
        variables = _string_constants(tree)
        looped = _looped_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            keywords = {kw.arg: kw.value for kw in node.keywords}
            name = keywords.get("name")
            documentation = keywords.get("documentation")
            documented = documentation.value if isinstance(documentation, ast.Constant) else None
            if isinstance(name, ast.Constant) and str(name.value).startswith("vllm:"):
                names = {name.value: documented}
            elif isinstance(name, ast.Name) and name.id in variables:
                names = dict.fromkeys(variables[name.id], documented)
            elif isinstance(name, ast.Name) and name.id in looped:
                names = looped[name.id]
            else:
                continue
            kind = metric_kind(node)
            if kind is None:
                continue
            for written in sorted(names):
                entry = {
                    "type": kind,
                    "documentation": names[written],
                    "file": str(path.relative_to(package.parent)),
                }
                if exposed_name(written, kind) != written:
                    entry["defined_as"] = written
                found[exposed_name(written, kind)] = entry
    return dict(sorted(found.items()))


def _literal_values(annotation: object) -> list[str]:
    """The strings of a (nested) typing.Literal, in order."""
    import typing

    values: list[str] = []
    for argument in typing.get_args(annotation):
        values += [argument] if isinstance(argument, str) else _literal_values(argument)
    return values


def speculative_config(version: str) -> dict:
    """vLLM's SpeculativeConfig as a recipe may write it: the method names (SpeculativeMethod), the MTP model
    types it takes as deprecated names of "mtp", and each key a user sets (the dataclass fields that are not
    the engine's own SkipValidation configs), with its type as written in the source."""
    import dataclasses

    from vllm.config.speculative import MTPModelTypes, SpeculativeConfig, SpeculativeMethod

    keys = {
        field.name: field.type.__name__ if isinstance(field.type, type) else str(field.type).replace("typing.", "")
        for field in dataclasses.fields(SpeculativeConfig)
        if field.init and "SkipValidation" not in str(field.type)
    }
    return {
        "vllm_version": version,
        "generated_by": "tests/contracts/vllm/regenerate.py",
        "methods": _literal_values(SpeculativeMethod),
        "mtp_aliases": [name for name in _literal_values(MTPModelTypes) if name != "mtp"],
        "keys": keys,
    }


def write_speculative_config(version: str) -> int:
    document = speculative_config(version)
    (ROOT / "recipes" / "vllm-speculative-config.json").write_text(json.dumps(document, indent=1) + "\n")
    return len(document["keys"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("version", help="the vLLM release installed in this python's venv, e.g. 0.33.0")
    args = parser.parse_args()
    import vllm

    if vllm.__version__ != args.version:
        sys.exit(f"this venv has vLLM {vllm.__version__}, not {args.version}: install vllm=={args.version} first")
    env = os.environ | {"VLLM_TARGET_DEVICE": "cpu", "COLUMNS": "80", "NO_COLOR": "1"}
    os.environ.update(env)
    help_text = serve_help(env)
    flags = parse_serve_help(help_text)
    problems = check_against_parser(flags, parser_truth())
    if problems:
        sys.exit("the help reader disagrees with vLLM's parser:\n  " + "\n  ".join(problems))

    (HERE / "serve-help-all.txt").write_text(header(args.version, "`vllm serve --help=all`") + help_text)
    flag_list = (
        header(args.version, f"the {len(flags)} flags of `vllm serve`") + FLAG_LIST_NOTE + render_flag_list(flags)
    )
    (ROOT / "recipes" / "vllm-serve-flags.txt").write_text(flag_list)
    found = metrics()
    written = (
        ("openai-schemas.json", "schemas", schemas()),
        ("metrics.json", "metrics", found),
        ("auth.json", "guarded_prefixes", guarded_prefixes()),
    )
    for file_name, key, body in written:
        document = {"vllm_version": args.version, "generated_by": "tests/contracts/vllm/regenerate.py", key: body}
        (HERE / file_name).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    plans = write_contract(args.version)
    speculative_keys = write_speculative_config(args.version)
    print(
        f"vLLM {args.version}: {len(flags)} flags, {len(SCHEMAS)} schemas, {len(found)} metrics, {plans} KV plans, "
        f"{speculative_keys} speculative-config keys"
    )
    return 0


FLAG_LIST_NOTE = """#
# Every flag of every recipe and inventory override is checked against this list in preflight
# (module_utils/recipe_rules.py), and again on the Spark against the pinned image's own `vllm serve --help=all`
# (library/vllm_image_flags.py). Format (module_utils/vllm_flags.py): --NAME KIND [ALIAS ...] [off=--NEGATIVE]
# [choices=A,B,...]; KIND: value, many (one or more values), json (a JSON value or --NAME.key VALUE), bool (no
# value; off= turns it off), switch (no value, no off form), optional (the value may be omitted).
# FlexibleArgumentParser also takes --flag_name for --flag-name, --flag=value, and -O3 for --optimization-level 3.
"""

if __name__ == "__main__":
    sys.exit(main())
