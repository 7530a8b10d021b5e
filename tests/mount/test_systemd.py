"""The shipped systemd units are valid (checked with systemd-analyze when it is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    # A template can only be verified as an instance.
    shutil.copy(UNITS / "bundlefs@.service", tmp_path / "bundlefs@example.service")
    for unit in ("mnt-imagenet.mount", "mnt-imagenet.automount"):
        shutil.copy(UNITS / unit, tmp_path / unit)
    units = sorted(str(p) for p in tmp_path.iterdir())
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_service_is_type_notify_and_not_sandboxed_into_a_private_namespace():
    text = (UNITS / "bundlefs@.service").read_text()
    assert "Type=notify" in text
    for option in ("PrivateTmp=", "ProtectSystem=", "ReadOnlyPaths=", "PrivateMounts="):
        assert f"\n{option}" not in text


def _directives(name: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit (comments skipped), values in order."""
    found: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if line.startswith(("#", ";", "[")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


def _fstab_lines() -> list[list[str]]:
    text = (UNITS / "fstab.example").read_text()
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_the_service_starts_after_the_network_is_online():
    # Wants= pulls the target in (After= alone orders only against a target someone else pulls).
    unit = _directives("bundlefs@.service")
    assert "network-online.target" in " ".join(unit["Wants"]).split()
    assert "network-online.target" in " ".join(unit["After"]).split()


def test_every_unit_documents_itself_with_pages_that_exist():
    docs = UNITS.parent / "docs"
    for name in ("bundlefs@.service", "mnt-imagenet.mount", "mnt-imagenet.automount"):
        uris = " ".join(_directives(name)["Documentation"]).split()
        assert uris, name
        for uri in uris:
            assert "example" not in uri and "invalid" not in uri, uri
            assert uri.startswith("file:/usr/local/share/doc/bundlefs/"), uri
            assert (docs / uri.rsplit("/", 1)[1]).is_file(), uri


def test_network_mount_examples_carry_netdev():
    # A bundle at a URL, and the example mount unit (whose comment says when to drop it).
    for fields in _fstab_lines():
        options = fields[3].split(",")
        if "://" in fields[0]:
            assert "_netdev" in options, fields
    assert "_netdev" in _directives("mnt-imagenet.mount")["Options"][0].split(",")
    assert any("://" in fields[0] for fields in _fstab_lines())  # the URL example is there


def test_no_example_puts_a_secret_in_its_options():
    values = [fields[3] for fields in _fstab_lines()]
    values += _directives("mnt-imagenet.mount")["Options"]
    values += _directives("bundlefs@.service").get("Environment", [])
    for value in values:
        assert "secret" not in value and "key=" not in value, value


def test_the_fstab_examples_options_are_all_understood():
    """mount.fuse3 passes them on (less ``_netdev``, ``nofail``, ``x-systemd.*``): bundlefs must
    know every one, or the line fails at boot."""
    from bundlefs.cli.mount import parse_mount_options

    for fields in _fstab_lines():
        assert fields[2] == "fuse.bundlefs"
        parse_mount_options([fields[3]])
    parse_mount_options(_directives("mnt-imagenet.mount")["Options"])


def test_a_root_service_keeps_its_disk_cache_in_var_cache():
    unit = _directives("bundlefs@.service")
    assert unit["CacheDirectory"] == ["bundlefs"]
    assert "BUNDLEFS_CACHE_DIR=%C/bundlefs" in unit["Environment"]
