"""The `skipprd` wheel (python/, built with maturin): pip ships the binary with the package.

tests/run builds the wheel from the same dev build the other tests run (``SKIPPR_WHEEL_DIR``);
without it this test builds one itself. The wheel is installed into a new venv with a PATH that
holds no Rust toolchain, and then:

* ``skipprd`` is on the venv's PATH and runs (``--version``, ``validate`` of a quickstart config),
* ``python -m skippr --version`` and ``skipprd --version`` name the same version,
* the ``skippr`` package in it writes a config that the shipped ``skipprd`` validates.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def _wheel(tmp_path: Path) -> Path:
    wheel_dir = os.environ.get("SKIPPR_WHEEL_DIR")
    if not wheel_dir or not list(Path(wheel_dir).glob("skipprd-*.whl")):
        wheel_dir = str(tmp_path / "wheels")
        maturin = Path(sys.executable).parent / "maturin"
        if not maturin.exists():
            pytest.fail("maturin is not installed in the test venv: run tests/run, which installs tests/requirements.txt")
        proc = subprocess.run([str(maturin), "build", "--quiet", "--profile", "dev", "--out", wheel_dir],
                              cwd=REPO / "python", capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = sorted(Path(wheel_dir).glob("skipprd-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_installs_skipprd_on_path_without_rust(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / "bin"
    # No cargo, rustc or ~/.cargo on PATH: installing a wheel must not need them.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUSTUP", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    proc = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                           str(wheel)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    installed = bin_dir / "skipprd"
    assert installed.exists(), "the wheel did not put skipprd into the venv's bin folder"
    which = subprocess.run(["sh", "-c", "command -v skipprd"], env=env, capture_output=True, text=True)
    assert which.stdout.strip() == str(installed)

    binary_version = subprocess.run(["skipprd", "--version"], env=env, capture_output=True, text=True, check=True)
    package_version = subprocess.run([str(bin_dir / "python"), "-m", "skippr", "--version"], env=env,
                                     capture_output=True, text=True, check=True)
    m_bin = re.fullmatch(r"skipprd (\S+)\n", binary_version.stdout)
    m_pkg = re.fullmatch(r"skippr (\S+)\n", package_version.stdout)
    assert m_bin and m_pkg, (binary_version.stdout, package_version.stdout)
    assert m_bin.group(1) == m_pkg.group(1)
    cargo_version = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M)
    assert cargo_version and m_bin.group(1) == cargo_version.group(1)

    # The package writes a quickstart-shaped config, and the shipped binary validates it,
    # directly and through `python -m skippr`.
    work = tmp_path / "work"
    work.mkdir()
    script = (
        "from skippr import Config, DataSinkLocalIceberg, DataSourcePostgres, EnvRef, LocalStorage, Pipeline\n"
        "cfg = Config().workspace('analytics').storage(LocalStorage())\n"
        "src = cfg.data_source('app_db', DataSourcePostgres(host='127.0.0.1', user='skippr_reader',\n"
        "    password=EnvRef('APP_DB_PASSWORD'), database='app', tables=['orders', 'customers']))\n"
        "lake = cfg.data_sink('lake', DataSinkLocalIceberg(warehouse='./warehouse'))\n"
        "cfg.pipeline('app', Pipeline(data_source=src, data_sink=lake))\n"
        "cfg.save('skippr.yml')\n"
    )
    subprocess.run([str(bin_dir / "python"), "-c", script], cwd=work, env=env, check=True, timeout=60)
    env["APP_DB_PASSWORD"] = "unused-by-validate"
    for cmd in (["skipprd", "validate"], [str(bin_dir / "python"), "-m", "skippr", "validate"]):
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "app" in proc.stdout + proc.stderr
