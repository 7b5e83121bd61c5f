#!/usr/bin/python
"""Ansible module vllm_model_probe: the health gate of a pooling model (embed or rerank), on its own endpoint."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_model_probe
short_description: Prove that an embedding or reranking vLLM endpoint answers right, not just that it is up
description:
  - A pooling model has no chat API, so the health gate's smoke request and quality gate do not apply. This sends
    its kind's own request (module_utils/model_kinds.py), whose right answer is known whatever the model.
  - O(kind) V(embed) - C(/v1/embeddings) with two paraphrases and an unrelated sentence - three vectors of one
    dimension, the paraphrases closer (cosine) than the unrelated sentence.
  - O(kind) V(rerank) - C(/v1/rerank) with a query and three passages - a score for each, the passage that answers the
    query first.
  - Both - the answer names the served model and counts its prompt tokens. A failure names what came back.
  - Changes nothing.
version_added: "0.4.0"
author: sparkfleet
options:
  url:
    description: Base URL of the endpoint, e.g. C(http://127.0.0.1:8001).
    type: str
    required: true
  served:
    description: The served model name.
    type: str
    required: true
  kind:
    description: What the model answers.
    type: str
    choices: [embed, rerank]
    required: true
  api_key:
    description: The endpoint's API key (sent as C(Authorization Bearer)); empty for none.
    type: str
    default: ""
  timeout_s:
    description: Seconds the request may take.
    type: float
    default: 120
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Probe the embedding endpoint
  vllm_model_probe:
    url: http://127.0.0.1:8001
    served: qwen3-embedding-0.6b
    kind: embed
"""

RETURN = r"""
found:
  description:
    - What the probe measured - for V(embed) C(dimension), C(paraphrase_cosine) and C(unrelated_cosine); for
      V(rerank) C(ranking) (passage indexes, best first) and C(scores).
  returned: success
  type: dict
  sample: {"dimension": 1024, "paraphrase_cosine": 0.91, "unrelated_cosine": 0.12}
"""

import json
import urllib.error
import urllib.request

from ansible.module_utils import model_kinds
from ansible.module_utils.basic import AnsibleModule


def ask(params: dict) -> dict:
    path, body = model_kinds.probe(params["kind"], params["served"])
    headers = {"Content-Type": "application/json"}
    if params["api_key"]:
        headers["Authorization"] = f"Bearer {params['api_key']}"
    request = urllib.request.Request(params["url"].rstrip("/") + path, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=params["timeout_s"]) as response:
        return json.loads(response.read())


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "served": {"type": "str", "required": True},
            "kind": {"type": "str", "choices": ["embed", "rerank"], "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "timeout_s": {"type": "float", "default": 120},
        },
        supports_check_mode=True,
    )
    params = module.params
    path, _ = model_kinds.probe(params["kind"], params["served"])
    try:
        answer = ask(params)
    except (OSError, ValueError) as error:
        detail = error.read().decode("utf-8", "replace")[:300] if isinstance(error, urllib.error.HTTPError) else ""
        module.fail_json(msg=f"The {params['kind']} probe to {params['url']}{path} failed: {error} {detail}".strip())
    if not isinstance(answer, dict):
        module.fail_json(msg=f"{params['served']} at {params['url']}{path} answered {str(answer)[:300]}, not an object")
    problems, found = model_kinds.probe_problems(params["kind"], answer, params["served"])
    if problems:
        module.fail_json(
            msg=f"{params['served']} ({params['kind']}) at {params['url']}{path}: " + "; ".join(problems),
            problems=problems,
            found=found,
        )
    module.exit_json(changed=False, found=found)


if __name__ == "__main__":
    main()
