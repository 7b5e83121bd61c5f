"""Free-space measurement for paths that may not exist yet (what the disk_space_info module reports)."""

import os

import pytest
from disk_space import GIB, free_space, nearest_existing, shortfall


def test_nearest_existing_walks_up_to_a_parent(tmp_path):
    assert nearest_existing(str(tmp_path / "a" / "b" / "c")) == str(tmp_path)
    assert nearest_existing(str(tmp_path)) == str(tmp_path)
    assert nearest_existing("/no/such/path/at/all") == "/"


def test_free_space_agrees_with_statvfs(tmp_path):
    measurement = free_space(str(tmp_path / "not-yet" / "weights"))
    stats = os.statvfs(tmp_path)
    assert measurement["measured_at"] == str(tmp_path)
    assert measurement["free_bytes"] == stats.f_bavail * stats.f_frsize
    assert 0 < measurement["free_bytes"] <= measurement["total_bytes"]


@pytest.mark.parametrize(
    ("free_gib", "needed", "message"),
    [
        (100, 80, None),
        (80, 80, None),
        (
            12.5,
            80,
            "/var/lib/sparkfleet (measured at /var/lib) has 12.5 GiB free; it needs 80 GiB. "
            "Free space there, or lower its min_free_gib in spark_preflight_disk_checks.",
        ),
    ],
)
def test_shortfall_names_the_path_and_the_variable(free_gib, needed, message):
    measurement = {"path": "/var/lib/sparkfleet", "measured_at": "/var/lib", "free_bytes": int(free_gib * GIB)}
    assert shortfall(measurement, needed, "spark_preflight_disk_checks") == message
