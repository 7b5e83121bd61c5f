"""What an inventory value may be, for every value that reaches a file or a command line (a systemd unit, a config
file, a container's arguments). Each rule here is the only definition of its kind; library/input_check.py applies
them in preflight, module_utils/recipe_rules.py to the recipes' values, the Hugging Face modules (hf_prefetch,
hf_model_figures, module_utils/hf_snapshot.py) to repo ids and commits, and the templates' quoting helpers
(filter_plugins/quoting.py) are the second line behind them.

The rules say what a value may BE, so a bad value cannot be expressed at all (a space in an image reference, a
newline anywhere, a "*" in an allow list), instead of escaping it and hoping every consumer agrees.

Each checker takes the value and returns None when it is good, or a short reason when it is not.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# Any C0 or C1 control character, DEL included: a newline in a unit starts a new directive, in rsyncd.conf a new
# module, in an env file a new variable.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# Docker's reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest], path components
# lowercase, tag at most 128 characters, digest sha256 with 64 hex digits.
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$"
)

# RFC 1123 host names (what a resolver accepts): labels of letters, digits and inner hyphens.
HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)

# A served model name: what clients send as "model", and what lands in unit names, file names, Prometheus labels
# and printed curl lines. Segments of letters, digits, ".", "_", "-", separated by single "/" (HF repo ids such
# as openai/gpt-oss-20b); each segment starts with a letter or digit, so ".." and "/x" cannot be written.
SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
SERVED_NAME_MAX = 128
# One folder name of a path the project writes (no separator, no "." or ".." of its own).
FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# An absolute path of the characters a path in a unit, a --volume value (":" separates its parts) and rsyncd.conf
# may hold unquoted. No "..": a path says where it goes.
SAFE_PATH = re.compile(r"^/(?:[A-Za-z0-9._+@-]+/?)*$")

# A Hugging Face Hub repository id, ORG/NAME: each part of letters, digits, '.', '_' and '-', starting with a letter or
# digit. It lands in cache folder names (models--ORG--NAME), Hub URLs and vLLM's command line.
HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")

# A pinned commit of a Hub repository: the full git commit id, 40 lowercase hex digits. A branch or a tag moves; a
# commit names one snapshot forever.
HF_COMMIT = re.compile(r"[0-9a-f]{40}")

# A revision to resolve: a commit, or a branch or tag name (letters, digits, '.', '_', '/' and '-', starting with a
# letter or digit, without ".." and not ending in '.' or '/', as git refuses those).
HF_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")

# Prometheus's duration format (model.ParseDuration): units from ms to y, largest first.
DURATION = re.compile(r"^(?:[0-9]+y)?(?:[0-9]+w)?(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?$")

LOOPBACK_NAMES = ("localhost",)

# Binds that mean "every address of this host".
WILDCARD_ADDRESSES = ("0.0.0.0", "::")


def control_character(value: str) -> str | None:
    match = CONTROL.search(value)
    if match is None:
        return None
    return f"contains the control character {match.group()!r}"


def is_loopback_host(host: str) -> bool:
    """Whether `host` (an address or a name) is this machine's loopback."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_wildcard(address: str) -> bool:
    """Whether a bind to `address` listens on every address of the host."""
    return address in WILDCARD_ADDRESSES


def text(value: object) -> str | None:
    """Free text on one line (a prompt, a flag's value, an environment value)."""
    if not isinstance(value, str):
        return "is not text"
    return control_character(value)


def secret(value: object) -> str | None:
    """An API key or token: printable, no spaces (it travels in an HTTP header and a file of KEY=value lines)."""
    if not isinstance(value, str):
        return "is not text"
    if control_character(value):
        return "contains a control character (a newline?)"
    if any(character.isspace() for character in value):
        return "contains a space"
    return None


def image(value: object) -> str | None:
    """A container image reference: [registry[:port]/]repository[:tag][@sha256:digest]."""
    if not isinstance(value, str) or not value:
        return "is not an image reference"
    found = control_character(value)
    if found:
        return found
    if any(character.isspace() for character in value):
        return "contains a space (an image reference is one word; Docker would read the rest as more arguments)"
    if value.startswith("-"):
        return "starts with '-' (Docker would read it as an option)"
    if not IMAGE_REFERENCE.match(value):
        return "is not of the form [registry[:port]/]repository[:tag][@sha256:<64 hex digits>], repository lowercase"
    return None


def address(value: object) -> str | None:
    """An IP address to listen on or to reach (IPv4 or IPv6, no brackets, no port)."""
    if not isinstance(value, str):
        return "is not an IP address"
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return control_character(value) or "is not an IP address (e.g. 127.0.0.1, 10.0.0.5 or ::1)"
    if "%" in value:
        # Python accepts any text after an IPv6 scope's "%", spaces and quotes included.
        return "has an IPv6 scope (%...): give the address alone"
    return None


def host(value: object) -> str | None:
    """An IP address or a DNS host name."""
    if not isinstance(value, str):
        return "is not a host name or address"
    if address(value) is None or HOST_NAME.match(value):
        return None
    return control_character(value) or "is not an IP address or a host name (letters, digits, '-' and '.')"


def network(value: object) -> str | None:
    """An IP address or a network in CIDR form (10.0.0.0/8); never a wildcard."""
    if not isinstance(value, str):
        return "is not an address or a network"
    every = "allows every address; name the networks that may connect (e.g. 10.0.0.0/24)"
    if value in ("*", "all"):
        return every
    if "%" in value:
        return "has an IPv6 scope (%...): give the network alone"
    try:
        parsed = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return control_character(value) or "is not an IP address or a network in CIDR form (e.g. 10.0.0.0/24)"
    return every if parsed.prefixlen == 0 else None


def port(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return "is not a whole number"
    if not 1 <= value <= 65535:
        return "is not a port (1-65535)"
    return None


def path(value: object) -> str | None:
    """An absolute path of letters, digits and . _ + @ - (no spaces, no ':', no '..')."""
    if not isinstance(value, str) or not value.startswith("/"):
        return "is not an absolute path"
    found = control_character(value)
    if found:
        return found
    if ":" in value:
        return "contains ':', which separates the parts of a container's --volume"
    if any(part == ".." for part in value.split("/")):
        return "contains '..'"
    if not SAFE_PATH.match(value):
        return "contains a character outside letters, digits, '/', '.', '_', '+', '@' and '-'"
    return None


def served_name(value: object) -> str | None:
    """A served model name: letters, digits, '.', '_', '-', in segments joined by single '/'."""
    if not isinstance(value, str) or not value:
        return "is not a name"
    if len(value) > SERVED_NAME_MAX:
        return f"is longer than {SERVED_NAME_MAX} characters"
    if not SERVED_NAME.match(value):
        return (
            control_character(value)
            or "may hold only letters, digits, '.', '_' and '-', in parts joined by single '/', each part starting "
            "with a letter or digit (e.g. qwen3-0.6b or openai/gpt-oss-20b)"
        )
    return None


def folder_name(value: object) -> str | None:
    """One folder name the project creates: letters, digits, '.', '_', '-', starting with a letter or digit."""
    if not isinstance(value, str) or not FOLDER_NAME.match(value):
        return (
            isinstance(value, str) and control_character(value)
        ) or "may hold only letters, digits, '.', '_' and '-' (at most 64), starting with a letter or digit"
    return None


def hf_repo(value: object) -> str | None:
    """A Hugging Face Hub repository id: ORG/NAME (e.g. Qwen/Qwen3-0.6B)."""
    if not isinstance(value, str) or not value:
        return "is not a Hugging Face repo id"
    if not HF_REPO.fullmatch(value):
        return control_character(value) or (
            "is not a Hugging Face repo id ORG/NAME of letters, digits, '.', '_' and '-', each part starting with a "
            "letter or digit (e.g. Qwen/Qwen3-0.6B)"
        )
    return None


def hf_commit(value: object) -> str | None:
    """A pinned commit of a Hugging Face repository: the full commit id, 40 lowercase hex digits."""
    if not isinstance(value, str) or not HF_COMMIT.fullmatch(value):
        return "is not a pinned commit: 40 lowercase hex digits (a branch or a tag moves; give the commit it names)"
    return None


def hf_revision(value: object) -> str | None:
    """A revision of a Hugging Face repository to resolve: a commit (hf_commit), or a branch or tag name (main)."""
    if isinstance(value, str) and (
        HF_COMMIT.fullmatch(value) or (HF_REF.fullmatch(value) and ".." not in value and not value.endswith((".", "/")))
    ):
        return None
    if isinstance(value, str) and control_character(value):
        return control_character(value)
    return "is not a revision: a 40-hex commit (lowercase), or a branch or tag name such as main"


def duration(value: object) -> str | None:
    """A Prometheus duration: 30s, 5m, 1h30m, 15d."""
    if not isinstance(value, str) or not value or not DURATION.match(value):
        return "is not a Prometheus duration (e.g. 30s, 5m, 1h30m, 15d)"
    return None


def url(value: object, *, allow_file: bool = False) -> str | None:
    """An https URL; plain http only to this machine's loopback (an SSH tunnel or a local mirror), where nothing
    on the network can read or change it; file:// where `allow_file` (a key already on the host's disk)."""
    if not isinstance(value, str):
        return "is not a URL"
    found = control_character(value) or (" contains a space" if " " in value else None)
    if found:
        return found.strip()
    parts = urlsplit(value)
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and parts.hostname and is_loopback_host(parts.hostname):
        return None
    if parts.scheme == "file" and allow_file and parts.path.startswith("/"):
        return None
    if parts.scheme == "http":
        return (
            "uses plain http to another machine, so anyone on the way can read the token or swap what is "
            "downloaded: use https (a mirror with a certificate), or reach the mirror through this host's loopback"
        )
    return "is not an https URL"


KINDS = {
    "text": text,
    "secret": secret,
    "image": image,
    "address": address,
    "host": host,
    "network": network,
    "port": port,
    "path": path,
    "served_name": served_name,
    "folder_name": folder_name,
    "hf_repo": hf_repo,
    "hf_commit": hf_commit,
    "hf_revision": hf_revision,
    "duration": duration,
    "url": url,
    "key_url": lambda value: url(value, allow_file=True),
}


def problem(kind: str, value: object) -> str | None:
    """The reason `value` is not a good `kind`, or None."""
    return KINDS[kind](value)
