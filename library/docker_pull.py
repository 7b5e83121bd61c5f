#!/usr/bin/python
"""Ansible module docker_pull: pull a Docker image through the Docker Engine API, writing progress to a file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: docker_pull
short_description: Pull a Docker image by tag or digest and keep a progress file up to date while it arrives
description:
  - Pulls O(name) at O(reference) through the Docker Engine API on the unix socket O(docker_socket)
    (C(POST /images/create), the call C(docker pull) makes), and while the stream of layer progress comes in,
    rewrites O(status_file) at most once a second with the pull's progress, so that a M(job_watch) task can tell
    a person how far a 10+ GB vLLM image has come.
  - Inspects the image first. A digest names one image forever, so when it is present nothing is pulled and
    nothing changes. A tag can move, so a tag is always pulled; the task reports a change only when the image
    the tag points at changed (or was absent).
  - "Run it with C(async) and C(poll: 0), then retry M(job_watch) (O(job_watch#module:kind=pull)) until it is
    done, then collect this module's result with M(ansible.builtin.async_status); see EXAMPLES."
  - Every run that is not in check mode leaves O(status_file) in state C(done) or C(failed), so a watcher
    always ends. Remove the file before starting the pull, or a watcher may read the previous pull's end.
  - Fails, naming the image, quoting the registry's words and saying what to check, when the tag or digest
    is unknown, the registry cannot be reached or refuses, or a layer breaks off; the status file then says
    C(failed) with the same words in C(error).
version_added: "0.1.0"
author: sparkfleet
options:
  name:
    description:
      - Repository to pull, without tag or digest, as C(docker pull) takes it.
      - Docker Hub repositories may be short (V(vllm/vllm-openai)); other registries start with their host
        and port (V(registry.example:5000/vllm/vllm-openai)).
    type: str
    required: true
  reference:
    description:
      - A tag (V(cu130-nightly)) or a digest (V(sha256:) and 64 hex digits).
      - Pin a digest in production; it cannot move, so a second run does not even ask the registry.
    type: str
    required: true
  status_file:
    description:
      - JSON file rewritten atomically (temporary file, then rename) with the pull's progress; mode C(0644), its
        folder created with mode C(0755) when missing.
      - "Keys: C(state) (V(pulling), V(done) or V(failed)), C(image), C(started) and C(updated) (epoch seconds),
        C(layers_total), C(layers_done), C(layers_present), C(layers_downloaded), C(layers_size_known),
        C(bytes_done), C(bytes_total_known), C(digest), C(outcome) and C(error)."
    type: path
    default: /run/sparkfleet/docker-pull.json
  docker_socket:
    description:
      - Unix socket of the Docker Engine API.
    type: path
    default: /var/run/docker.sock
attributes:
  check_mode:
    support: full
    details: Inspects only; reports a change when a pull would happen (the image is absent, or O(reference) is a
      tag). Does not write O(status_file).
  diff_mode:
    support: full
    details: The image ID before and after.
  async:
    support: full
notes:
  - "Needs access to the Docker socket, normally root (C(become: true)) or the C(docker) group; writing under
    C(/run) needs root."
  - Speaks Docker Engine API v1.41 (Docker 20.10) and needs nothing but Python's standard library on the host.
  - Bytes are compressed layer sizes, as the registry sends them; unpacking after the download takes extra time
    that the byte counts do not show (C(layers_done) counts layers unpacked).
seealso:
  - module: job_watch
  - module: community.docker.docker_image_pull
"""

EXAMPLES = r"""
- name: Image | Remove the previous pull's progress file
  ansible.builtin.file:
    path: /run/sparkfleet/docker-pull.json
    state: absent

- name: Image | Pull vLLM (in the background)
  docker_pull:
    name: vllm/vllm-openai
    reference: sha256:6f0a1c0f5e7b4d2a9c8e3b1d0f2a4c6e8b0d2f4a6c8e0b2d4f6a8c0e2b4d6f8a
  async: 14400
  poll: 0
  register: image_pull_job

# Then job_watch reports its progress until it ends, and async_status collects the result: see job_watch's
# examples.

- name: Pull a tag from a local registry, in the foreground
  docker_pull:
    name: registry.example:5000/vllm/vllm-openai
    reference: cu130-nightly
"""

RETURN = r"""
image_id:
  description: ID of the image (the digest of its config), after the pull; null in check mode when absent.
  returned: success
  type: str
  sample: sha256:f61325c7626e69f79c64045d0be0037b664f29a0860dbad89e4181e600589a89
repo_digests:
  description: The image's RepoDigests as Docker reports them (Docker Hub entries without C(docker.io/)).
  returned: success
  type: list
  elements: str
  sample:
    - vllm/vllm-openai@sha256:ceb12cca0f9b041348eb6126f0ba9fbbe11875f3e29c96c5be64d3da33689942
digest:
  description:
    - The manifest digest of O(name) at O(reference) - the C(sha256:) to pin. From the pull's own
      C(Digest:) line, else from the RepoDigests entry of O(name) (C(docker.io/) and C(library/) prefixes
      allowed for); null when neither says.
  returned: success
  type: str
  sample: sha256:ceb12cca0f9b041348eb6126f0ba9fbbe11875f3e29c96c5be64d3da33689942
pulled:
  description: Whether a pull ran (a tag is always pulled; a present digest never is).
  returned: always
  type: bool
  sample: true
image:
  description: The reference pulled, O(name) joined with O(reference).
  returned: always
  type: str
  sample: vllm/vllm-openai:cu130-nightly
progress:
  description: The last record written to O(status_file) (see there for its keys).
  returned: when a pull ran
  type: dict
  sample:
    state: done
    image: vllm/vllm-openai:cu130-nightly
    started: 1764474452.1
    updated: 1764475290.4
    layers_total: 31
    layers_done: 31
    layers_present: 0
    layers_downloaded: 31
    layers_size_known: 31
    bytes_done: 10412345678
    bytes_total_known: 10412345678
    digest: sha256:ceb12cca0f9b041348eb6126f0ba9fbbe11875f3e29c96c5be64d3da33689942
    outcome: Downloaded newer image for vllm/vllm-openai:cu130-nightly
    error: null
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.docker_engine import (
    DockerEngineError,
    api_path,
    image_path,
    request_json,
    stream_json,
)
from ansible.module_utils.pull_progress import (
    apply_event,
    explain_pull_error,
    image_reference,
    is_digest,
    name_problem,
    new_tracker,
    progress_record,
    reference_problem,
    repo_digest_for,
    write_status_file,
)

# The status file is rewritten at most this often while the stream runs (and always at the end).
WRITE_EVERY_SECONDS = 1.0


def engine_failure(socket_path: str, error: DockerEngineError) -> str:
    return (
        f"Could not use the Docker Engine: {error.message}. Check that dockerd runs (systemctl status docker) and "
        f"that this task may use {socket_path} (become: true, or a user in the docker group)."
    )


def inspect_image(module: AnsibleModule, reference: str) -> dict | None:
    """The engine's inspect of `reference`, or None when the image is not here."""
    socket_path = module.params["docker_socket"]
    try:
        status, body = request_json("GET", image_path(reference), socket_path)
    except DockerEngineError as error:
        module.fail_json(msg=engine_failure(socket_path, error), image=reference, pulled=False)
    if status == 404:
        return None
    if status != 200 or not isinstance(body, dict):
        words = body.get("message") if isinstance(body, dict) else body
        module.fail_json(
            msg=f"The Docker Engine could not inspect {reference}: HTTP {status}: {words}",
            image=reference,
            pulled=False,
        )
    return body


class StatusWriter:
    """Writes progress records to the status file: at most once a second, and always when forced."""

    def __init__(self, module: AnsibleModule, image: str, started: float) -> None:
        self.module = module
        self.path = module.params["status_file"]
        self.image = image
        self.started = started
        self.last_write = 0.0
        self.record: dict = {}

    def write(self, tracker: dict, state: str, force: bool = False) -> dict:
        now = time.monotonic()
        if not force and now - self.last_write < WRITE_EVERY_SECONDS:
            return self.record
        self.record = progress_record(tracker, self.image, state, self.started, time.time())
        try:
            write_status_file(self.path, self.record)
        except OSError as error:
            self.module.fail_json(
                msg=f"Could not write the pull's status file {self.path}: {error}. Choose a status_file in a folder "
                "this task may create and write (the default under /run needs become: true).",
                image=self.image,
                pulled=False,
            )
        self.last_write = now
        return self.record


def image_facts(name: str, reference: str, inspected: dict | None, pulled_digest: str | None = None) -> dict:
    """The module's return values that describe the image."""
    if inspected is None:
        return {"image_id": None, "repo_digests": [], "digest": reference if is_digest(reference) else None}
    repo_digests = list(inspected.get("RepoDigests") or [])
    digest = pulled_digest or repo_digest_for(name, repo_digests)
    if digest is None and is_digest(reference):
        digest = reference
    return {"image_id": inspected.get("Id"), "repo_digests": repo_digests, "digest": digest}


def pull(module: AnsibleModule, image: str) -> tuple[dict, StatusWriter]:
    """Pull, folding the stream into the status file; returns the tracker and its writer, whose last record
    still says "pulling". Fails the module, and marks the status file failed, on any error."""
    params = module.params
    started = time.time()
    tracker = new_tracker()
    writer = StatusWriter(module, image, started)
    writer.write(tracker, "pulling", force=True)
    path = api_path("/images/create", {"fromImage": params["name"], "tag": params["reference"]})
    failure = None
    try:
        for event in stream_json("POST", path, params["docker_socket"]):
            apply_event(tracker, event)
            if tracker["error"]:
                break
            writer.write(tracker, "pulling")
    except DockerEngineError as error:
        if error.status is None:
            failure = engine_failure(params["docker_socket"], error)
        tracker["error"] = error.message
    if tracker["error"]:
        record = writer.write(tracker, "failed", force=True)
        failure = failure or explain_pull_error(params["name"], params["reference"], tracker["error"])
        module.fail_json(msg=failure, image=image, pulled=False, progress=record)
    return tracker, writer


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "reference": {"type": "str", "required": True},
            "status_file": {"type": "path", "default": "/run/sparkfleet/docker-pull.json"},
            "docker_socket": {"type": "path", "default": "/var/run/docker.sock"},
        },
        supports_check_mode=True,
    )
    name = module.params["name"]
    reference = module.params["reference"]
    problem = name_problem(name) or reference_problem(reference)
    if problem:
        module.fail_json(msg=problem + ".", pulled=False)
    image = image_reference(name, reference)

    before = inspect_image(module, image)
    if before is not None and is_digest(reference):
        # A digest names one image forever: nothing to ask the registry. The status file still ends, so a
        # watcher started for this run stops waiting.
        if not module.check_mode:
            writer = StatusWriter(module, image, time.time())
            tracker = dict(new_tracker(), outcome="already present; a digest cannot move, so nothing was pulled")
            writer.write(tracker, "done", force=True)
        module.exit_json(changed=False, pulled=False, image=image, **image_facts(name, reference, before))

    before_id = before.get("Id") if before else None
    if module.check_mode:
        module.exit_json(changed=True, pulled=False, image=image, **image_facts(name, reference, before))

    tracker, writer = pull(module, image)
    after = inspect_image(module, image)
    if after is None:
        tracker["error"] = f"Docker reported pulling {image}, but then had no such image"
        record = writer.write(tracker, "failed", force=True)
        module.fail_json(
            msg=tracker["error"] + "; check dockerd's log (journalctl -u docker) and the free space under "
            "/var/lib/docker.",
            image=image,
            pulled=True,
            progress=record,
        )
    result = {
        "changed": after.get("Id") != before_id,
        "pulled": True,
        "image": image,
        "progress": writer.write(tracker, "done", force=True),
        **image_facts(name, reference, after, tracker["digest"]),
    }
    if module._diff:
        result["diff"] = {"before": {"image_id": before_id}, "after": {"image_id": after.get("Id")}}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
