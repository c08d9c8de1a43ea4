"""Dependencies are pinned: setup.sh installs from constraints.txt, which pins every package the
project and its test extras need (the installed closure), so a fresh machine gets the versions
the tests passed with."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not an exact pin"
            out[canonicalize_name(name)] = version
    return out


def test_setup_installs_from_the_constraints_file():
    setup = (ROOT / "setup.sh").read_text(encoding="utf-8")
    install = [ln for ln in setup.splitlines() if "pip install" in ln and '-e ".[test]"' in ln and "--upgrade" not in ln]
    assert install and all("-c constraints.txt" in ln for ln in install), install
    assert "constraints.txt" in setup.split("WANT=", 1)[1].splitlines()[0]   # a new pin set reinstalls
    assert "--refresh-constraints" in setup and "--refresh-constraints" in (ROOT / "README.md").read_text()


def test_every_direct_dependency_is_pinned_within_its_bounds():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pinned = pins()
    for text in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "torch":
            assert name not in pinned   # setup.sh pins torch (TORCH_VERSION): CPU and CUDA builds differ
            continue
        assert name in pinned, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{req.name}=={pinned[name]} vs {req}"


def test_the_pins_are_the_installed_closure():
    """What the tests run with is what constraints.txt says (refresh with ./setup.sh --refresh-constraints)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from freeze_constraints import closure
    finally:
        sys.path.pop(0)
    installed = closure()
    pinned = pins()
    assert set(installed) <= set(pinned), f"needed but not pinned: {sorted(set(installed) - set(pinned))}"
    differ = {k: (pinned[k], v) for k, v in installed.items() if pinned[k] != v}
    assert not differ, f"installed versions differ from constraints.txt (pinned, installed): {differ}"
    assert metadata.version("torch").split("+")[0] == _setup_torch_version()


def _setup_torch_version() -> str:
    out = subprocess.run(["bash", "-c", "grep -o 'TORCH_VERSION:-[0-9.]*' setup.sh"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split("-", 1)[1]
