"""Filter bcrypt_login: the bcrypt hash of a login's password for exporter-toolkit's web configuration
(node_exporter's and Prometheus's `basic_auth_users`), stable across runs.

bcrypt salts each hash at random, so hashing the same password again writes a different file and restarts the
service on every run. Instead the role reads the hash the host has now and keeps it while it still verifies the
password (bcrypt's own check); only a new password, user or an unreadable hash gets a new hash. A salt derived
from the password would be stable too, but it would sit in the file in the clear and let anyone who reads it test
guesses at the speed of that derivation instead of bcrypt's; a random salt has no such shortcut.

Runs on the controller (the template action renders there), with pyca's bcrypt (requirements.txt): ansible-core's
password_hash('bcrypt') needs passlib, which is unmaintained and breaks with current bcrypt releases.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

try:
    import bcrypt
except ImportError:  # pragma: no cover - reported when the filter is used
    bcrypt = None

# bcrypt reads no further than 72 bytes of a password (pyca's bcrypt 5 refuses longer ones).
MAX_PASSWORD_BYTES = 72
DEFAULT_ROUNDS = 12


def hash_verifies(password: bytes, hashed: object) -> bool:
    """Whether HASHED is a bcrypt hash (any of the 2a, 2b, 2y variants) of PASSWORD."""
    if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
        return False
    try:
        return bcrypt.checkpw(password, hashed.encode("ascii"))
    except ValueError:  # not a well-formed hash: replace it
        return False


def bcrypt_login(password: object, kept: object = "", rounds: int = DEFAULT_ROUNDS) -> str:
    """KEPT when it is a bcrypt hash of PASSWORD, else a new hash of PASSWORD with a random salt and ROUNDS."""
    if bcrypt is None:
        raise AnsibleFilterError(
            "bcrypt_login: the Python package bcrypt is missing on the controller: pip install -r requirements.txt"
        )
    if not isinstance(password, str) or not password:
        raise AnsibleFilterError("bcrypt_login: the password must be a non-empty string")
    secret = password.encode("utf-8")
    if len(secret) > MAX_PASSWORD_BYTES:
        raise AnsibleFilterError(f"bcrypt_login: a password may hold at most {MAX_PASSWORD_BYTES} bytes")
    if hash_verifies(secret, kept):
        return str(kept)
    return bcrypt.hashpw(secret, bcrypt.gensalt(rounds=int(rounds))).decode("ascii")


class FilterModule:
    def filters(self) -> dict:
        return {"bcrypt_login": bcrypt_login}
