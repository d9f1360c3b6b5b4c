"""The systemd unit as `make install-unit` puts it in place: systemd-analyze verifies it and
rates its exposure 3.0 or lower. That it runs, is restarted by the watchdog and keeps limits
in force is tested under a real systemd in test_e2e_service.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
MAX_EXPOSURE = 3.0

pytestmark = pytest.mark.skipif(SYSTEMD_ANALYZE is None,
                                reason="systemd-analyze missing: install Debian's systemd")


@pytest.fixture(scope="module")
def unit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unit rendered by the install path (ExecStart: the dqoesd of this Python)."""
    where = tmp_path_factory.mktemp("unit")
    subprocess.run(["make", "-s", "-C", str(REPO), "install-unit", f"UNITDIR={where}",
                    f"DEFAULTS={where / 'dqoesd.default'}"], check=True, timeout=60)
    return where / "dqoesd.service"


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, *args], capture_output=True, text=True,
                          timeout=120)


def test_the_unit_verifies_clean(unit: Path) -> None:
    executable = re.search(r"^ExecStart=(\S+)", unit.read_text(), re.M)
    assert executable and Path(executable[1]).is_file(), "install-unit points at dqoesd"
    result = _analyze("verify", str(unit))
    assert result.returncode == 0 and not result.stdout + result.stderr, result


def test_the_unit_exposure_is_at_most_3(unit: Path) -> None:
    result = _analyze("security", "--offline=yes", "--no-pager", str(unit))
    score = re.search(r"Overall exposure level for dqoesd\.service: (\d+\.\d+)", result.stdout)
    assert score, result.stdout + result.stderr
    print(f"systemd-analyze security: exposure {score[1]}")
    assert float(score[1]) <= MAX_EXPOSURE, result.stdout


def test_the_cgroup_tree_stays_writable_and_rings_outlive_a_restart(unit: Path) -> None:
    settings = dict(line.split("=", 1) for line in unit.read_text().splitlines()
                    if "=" in line and not line.startswith("#"))
    assert "ProtectControlGroups" not in settings
    assert "/sys/fs/cgroup" in settings["ReadWritePaths"].split()
    assert settings["RuntimeDirectoryPreserve"] == "yes"
