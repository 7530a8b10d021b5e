"""The shipped systemd units are valid (checked with systemd-analyze when it is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "systemd"


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
