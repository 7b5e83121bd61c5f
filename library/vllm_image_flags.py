#!/usr/bin/python
"""Ansible module vllm_image_flags: check the served models' flags against the pinned image's own vLLM."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_image_flags
short_description: Check every recipe and override flag against the C(vllm serve --help=all) of the image itself
description:
  - Preflight checks the flags against the committed flag list of a vLLM release; the image the Spark runs is the
    authority. This module runs C(vllm serve --help=all) inside O(image) once per image ID, keeps the answer in
    O(cache_dir), and checks every model in O(models) against it, with the same messages (and "did you mean")
    as the preflight check.
  - Fails listing every problem before any unit is written, so a flag the image's vLLM lacks stops the run
    instead of a unit that dies after a long weight load.
  - For a model with the harmony reasoning parser (gpt-oss, C(openai_gptoss)), also checks that the image loads the
    harmony vocabulary (C(o200k_base.tiktoken)) with no network. vLLM images with C(oss-harmony) carry it; older
    ones download it at every start (vllm#22525), which fails on an air-gapped Spark. Cached per image ID too.
  - In check mode an image whose answers are not cached yet is not run; the answer says so.
version_added: "0.2.0"
author: sparkfleet
options:
  image:
    description: The image the models run (an image ID, or a reference Docker resolves locally).
    type: str
    required: true
  cache_dir:
    description: Folder for the cached help texts, one file per image ID.
    type: path
    required: true
  models:
    description: The checked models, each C(label) (how messages name it) and C(recipe) (merged, as C(vllm_recipe)
      returns it).
    type: list
    elements: dict
    required: true
  docker_args:
    description: Arguments of C(docker run) before the image, e.g. C(--gpus all) (platform plugins can add flags).
    type: list
    elements: str
    default: [--gpus, all]
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the flags against the image's own vLLM
  vllm_image_flags:
    image: "{{ vllm_image_id }}"
    cache_dir: /var/lib/sparkfleet/image-flags
    models:
      - label: vllm_server_models[0] (recipe qwen3-0.6b)
        recipe: "{{ checked.recipe }}"
"""

RETURN = r"""
image_id:
  description: The ID of the image whose help was read.
  returned: success
  type: str
help_file:
  description: The cached C(vllm serve --help=all) of that image.
  returned: success
  type: str
flags:
  description: How many flags the image's C(vllm serve) has (0 when check mode could not read them).
  returned: always
  type: int
harmony_offline:
  description: Whether the image loads the harmony vocabulary offline; null when no model needs it (or check mode).
  returned: always
  type: bool
problems:
  description: Every problem found; empty on success.
  returned: always
  type: list
  elements: str
"""

import re
from pathlib import Path

from ansible.module_utils.atomic_file import write_text_atomically
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.recipe_rules import flag_problems
from ansible.module_utils.vllm_flags import parse_serve_help


def cache_file(cache_dir: str, image_id: str) -> Path:
    """Where the help of one image ID is kept: sha256:abc… -> sha256-abc….help.txt."""
    return Path(cache_dir) / (re.sub(r"[^A-Za-z0-9_.-]", "-", image_id) + ".help.txt")


# The harmony parser's tokenizer, loaded in the image with no network, the way vLLM loads it for gpt-oss
# (vllm/entrypoints/openai/parser/harmony_utils.py).
HARMONY_PROBE = (
    "from openai_harmony import HarmonyEncodingName, load_harmony_encoding; "
    "load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)"
)
HARMONY_PARSER = "openai_gptoss"
HARMONY_FIX = (
    "its openai_harmony downloads o200k_base.tiktoken at every start (vllm-project/vllm#22525), which an air-gapped "
    "Spark cannot: pin an image whose vLLM carries oss-harmony (vLLM 0.33.0 does), or put o200k_base.tiktoken "
    "(sha256 446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d) in "
    "<vllm_server_data_dir>/huggingface/tiktoken/ and set env: {TIKTOKEN_ENCODINGS_BASE: "
    "/root/.cache/huggingface/tiktoken} in the model's vllm_server_models entry (that folder is mounted there)"
)


def needs_harmony(recipe: dict) -> bool:
    """A model whose chat goes through the harmony tokenizer (gpt-oss), unless the user points it at local files."""
    flags = recipe.get("serve_flags") or {}
    return flags.get("reasoning-parser") == HARMONY_PARSER and "TIKTOKEN_ENCODINGS_BASE" not in (
        recipe.get("env") or {}
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "cache_dir": {"type": "path", "required": True},
            "models": {"type": "list", "elements": "dict", "required": True},
            "docker_args": {"type": "list", "elements": "str", "default": ["--gpus", "all"]},
        },
        supports_check_mode=True,
    )
    params = module.params
    docker = module.get_bin_path("docker", required=True)
    rc, out, err = module.run_command([docker, "image", "inspect", "--format", "{{.Id}}", params["image"]])
    if rc != 0 and module.check_mode:
        # Check mode on a host whose image is not pulled yet: nothing to read, and nothing changed.
        module.exit_json(changed=False, image_id="", help_file="", flags=0, harmony_offline=None, problems=[])
    if rc != 0:
        module.fail_json(msg=f"the image {params['image']} is not on this host ({err.strip()}): run vllm_image first")
    image_id = out.strip()
    help_file = cache_file(params["cache_dir"], image_id)
    changed = False
    if help_file.is_file():
        help_text = help_file.read_text(encoding="utf-8")
    elif module.check_mode:
        module.exit_json(
            changed=True, image_id=image_id, help_file=str(help_file), flags=0, harmony_offline=None, problems=[]
        )
    else:
        argv = [docker, "run", "--rm", "--pull", "never", *params["docker_args"], "--entrypoint", "vllm"]
        rc, help_text, err = module.run_command([*argv, image_id, "serve", "--help=all"])
        if rc != 0:
            module.fail_json(msg=f"`vllm serve --help=all` failed in the image {image_id} (exit {rc}): {err[-2000:]}")
        write_text_atomically(help_file, help_text)
        changed = True
    try:
        specs = parse_serve_help(help_text)
    except ValueError as error:
        module.fail_json(msg=f"{help_file}: {error}; delete the file to read the image's help again")
    source = f"the pinned image's vLLM ({image_id[:19]})"
    problems = [
        problem
        for model in params["models"]
        for problem in flag_problems(model["recipe"], specs, model["label"], source)
    ]
    harmony_offline = None
    harmony_labels = [model["label"] for model in params["models"] if needs_harmony(model["recipe"])]
    if harmony_labels:
        marker = help_file.with_name(help_file.name.replace(".help.txt", ".harmony-offline"))
        if marker.is_file():
            harmony_offline = marker.read_text(encoding="utf-8").strip() == "yes"
        elif not module.check_mode:
            argv = [docker, "run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "python3"]
            rc, _, _ = module.run_command([*argv, image_id, "-c", HARMONY_PROBE])
            harmony_offline = rc == 0
            write_text_atomically(marker, "yes\n" if harmony_offline else "no\n")
            changed = True
        if harmony_offline is False:
            problems += [
                f"{label}: the image {image_id[:19]} cannot start gpt-oss offline: {HARMONY_FIX}"
                for label in harmony_labels
            ]
    result = {"image_id": image_id, "flags": len(specs), "harmony_offline": harmony_offline}
    if problems:
        module.fail_json(msg="; ".join(problems), problems=problems, **result)
    module.exit_json(changed=changed, help_file=str(help_file), problems=[], **result)


if __name__ == "__main__":
    main()
