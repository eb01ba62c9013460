"""The lab's boot pieces (lab/sparklab/node_tools): the systemctl shim's unit handling and the
docker runtime's restart policies at boot, run without root on temporary directories."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "node_tools"
sys.path.insert(0, str(TOOLS))

import sparklab_units as units  # noqa: E402
from sparklab_dockerd_boot import should_restart  # noqa: E402

EARLYOOM = """[Service]
EnvironmentFile=-/nonexistent
EnvironmentFile=-{env}
ExecStart=/usr/bin/earlyoom $EARLYOOM_ARGS
[Install]
WantedBy=multi-user.target
"""


@pytest.fixture
def unit_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    etc = tmp_path / "etc"
    lib = tmp_path / "lib"
    etc.mkdir()
    lib.mkdir()
    monkeypatch.setattr(units, "ETC", str(etc))
    monkeypatch.setattr(units, "UNIT_DIRS", (str(etc), str(lib)))
    return tmp_path


def test_enable_links_the_unit_where_its_target_wants_it_and_disable_unlinks(unit_dirs: Path) -> None:
    (unit_dirs / "etc" / "x.service").write_text("[Service]\nExecStart=/bin/true\n"
                                                 "[Install]\nWantedBy=multi-user.target\n")
    assert not units.is_enabled("x.service")
    out = units.enable("x.service")
    link = unit_dirs / "etc" / "multi-user.target.wants" / "x.service"
    assert link.is_symlink() and out == [f"Created symlink {link} \u2192 {unit_dirs}/etc/x.service."]
    assert units.is_enabled("x.service") and units.enable("x.service") == []
    assert units.disable("x.service") == [f'Removed "{link}".'] and not units.is_enabled("x.service")


def test_only_the_administrators_units_and_earlyoom_are_run(unit_dirs: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (unit_dirs / "etc" / "sparkctl-serve-s.service").write_text("[Service]\nExecStart=/bin/true\n")
    (unit_dirs / "lib" / "systemd-udev-trigger.service").write_text("[Service]\nExecStart=/x\n")
    (unit_dirs / "lib" / "earlyoom.service").write_text("[Service]\nExecStart=/x\n")
    assert units.handled("sparkctl-serve-s.service") and units.handled("earlyoom.service")
    assert not units.handled("systemd-udev-trigger.service")


def test_environment_file_and_dollar_expansion_as_systemd_does(unit_dirs: Path) -> None:
    env_file = unit_dirs / "default"
    env_file.write_text('# comment\nEARLYOOM_ARGS="-M 1024,512 --avoid ^(sshd|x)$"\n')
    path = unit_dirs / "lib" / "earlyoom.service"
    path.write_text(EARLYOOM.format(env=env_file))
    unit = units.parse_unit(str(path))
    env = units.environment(unit)
    argv = units.exec_argv(units.values(unit, "Service", "ExecStart")[0], env)
    assert argv == ["/usr/bin/earlyoom", "-M", "1024,512", "--avoid", "^(sshd|x)$"]
    assert units.exec_argv("-/bin/echo ${A}", {"A": "one two"}) == ["/bin/echo", "one two"]


def container(policy: str, **state: Any) -> dict[str, Any]:
    return {"HostConfig": {"RestartPolicy": {"Name": policy}},
            "State": {"Running": False, "ExitCode": 255, **state}}


@pytest.mark.parametrize(("policy", "state", "restart"), [
    ("no", {}, False),
    ("always", {}, True),
    ("always", {"ManuallyStopped": True}, True),
    ("unless-stopped", {}, True),
    ("unless-stopped", {"ManuallyStopped": True}, False),
    ("on-failure", {}, True),
    ("on-failure:3", {"ExitCode": 0}, False),
    ("always", {"Running": True}, False),
])
def test_restart_policies_at_boot_as_dockerd(policy: str, state: dict[str, Any], restart: bool) -> None:
    assert should_restart(container(policy, **state)) is restart
