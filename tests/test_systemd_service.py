"""The systemd units as `make install-unit` puts them in place (dqoesd, and the cluster's
dqoes-agent and dqoes-manager): systemd-analyze verifies each and rates its exposure at most
its bound, each starts the script installed for this Python with the options of its own
options file. That dqoesd runs, is restarted by the watchdog and keeps limits in force is
tested under a real systemd in test_e2e_service.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
# Each unit's exposure as `systemd-analyze security` rates it (systemd 252: dqoesd 2.4,
# dqoes-agent 1.7, dqoes-manager 2.0), with a margin for other systemd versions' weights.
MAX_EXPOSURE = {"dqoesd": 3.0, "dqoes-agent": 2.0, "dqoes-manager": 2.5}

pytestmark = pytest.mark.skipif(SYSTEMD_ANALYZE is None,
                                reason="systemd-analyze missing: install Debian's systemd")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the install path put the units and their options files."""
    where = tmp_path_factory.mktemp("units")
    _install_units(where)
    return where


def _install_units(where: Path) -> None:
    subprocess.run(["make", "-s", "-C", str(REPO), "install-unit", f"PYTHON={sys.executable}",
                    f"UNITDIR={where}", f"DEFAULTDIR={where}",
                    f"DOCKER_PLUGINS={where / 'plugins'}"], check=True, timeout=60)


@pytest.fixture(params=sorted(MAX_EXPOSURE))
def unit(request: pytest.FixtureRequest, installed: Path) -> Path:
    return installed / f"{request.param}.service"


def _settings(unit: Path) -> dict[str, str]:
    """The unit's settings, the last assignment of each."""
    return dict(line.split("=", 1) for line in unit.read_text().splitlines()
                if "=" in line and not line.startswith("#"))


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run([SYSTEMD_ANALYZE, *args], capture_output=True, text=True,
                          timeout=120)


def test_the_unit_verifies_clean(unit: Path) -> None:
    result = _analyze("verify", str(unit))
    assert result.returncode == 0 and not result.stdout + result.stderr, result


def test_the_unit_starts_the_installed_script_with_its_options(unit: Path) -> None:
    executable, options = _settings(unit)["ExecStart"].split()
    assert Path(executable) == Path(sysconfig.get_path("scripts")) / unit.stem
    assert Path(executable).is_file(), "install-unit points at the script pip installed"
    options_file = Path(_settings(unit)["EnvironmentFile"].removeprefix("-"))
    assert options_file == Path("/etc/default") / unit.stem
    installed = (unit.parent / unit.stem).read_text()
    assert re.search(rf"^{options.removeprefix('$')}=", installed, re.M), installed


def test_the_unit_exposure_is_at_most_its_bound(unit: Path) -> None:
    result = _analyze("security", "--offline=yes", "--no-pager", str(unit))
    score = re.search(rf"Overall exposure level for {re.escape(unit.name)}: (\d+\.\d+)",
                      result.stdout)
    assert score, result.stdout + result.stderr
    print(f"systemd-analyze security: {unit.name} exposure {score[1]}")
    assert float(score[1]) <= MAX_EXPOSURE[unit.stem], result.stdout


def test_the_units_sharing_the_runtime_directory_keep_it_and_its_mode(installed: Path
                                                                       ) -> None:
    """/run/dqoes holds the rings that containers mount: a unit that stops must not remove
    it, nor one that starts change its mode."""
    sharing = {u.stem: _settings(u) for u in installed.glob("*.service")
               if "RuntimeDirectory" in _settings(u)}
    assert set(sharing) == {"dqoesd", "dqoes-manager"}
    for settings in sharing.values():
        assert settings["RuntimeDirectory"] == "dqoes"
        assert settings["RuntimeDirectoryPreserve"] == "yes"
        assert settings["RuntimeDirectoryMode"] == "0755"


def test_an_edited_options_file_is_kept(tmp_path: Path) -> None:
    _install_units(tmp_path)
    edited = tmp_path / "dqoes-manager"
    edited.write_text('DQOES_MANAGER_OPTS="--placement qoe"\n')
    _install_units(tmp_path)
    assert edited.read_text() == 'DQOES_MANAGER_OPTS="--placement qoe"\n'


def test_dqoesd_may_write_the_cgroup_tree(installed: Path) -> None:
    settings = _settings(installed / "dqoesd.service")
    assert "ProtectControlGroups" not in settings
    assert "/sys/fs/cgroup" in settings["ReadWritePaths"].split()
