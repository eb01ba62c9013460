"""Shell metacharacters in inventory strings that reach remote commands stay inert on the lab:
nothing they name runs, and the literal value is used (the directory with that odd name exists).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab
from faultkit import CONTAINER, converge, explain, up

pytestmark = pytest.mark.lab

PWNED = "/tmp/sparkctl-pwned"
HF_CACHE = f"~/.cache/hf $(touch {PWNED}) `touch {PWNED}` ; touch {PWNED} | x & y"


def pwned_anywhere(lab: Lab) -> list[str]:
    where = [f"host:{PWNED}"] if Path(PWNED).exists() else []
    for node in lab.nodes:
        if lab.exec(node, f"test -e {PWNED}", check=False).returncode == 0:
            where.append(f"{node}:{PWNED}")
        inside = lab.exec(node, f"docker exec {CONTAINER} test -e {PWNED}", check=False,
                          user="nvidia")
        if inside.returncode == 0:
            where.append(f"{node}:container:{PWNED}")
    return where


def test_metacharacters_in_hf_cache_are_inert(lab: Lab, tmp_path: Path, tally: Any) -> None:
    assert pwned_anywhere(lab) == [], "a marker from an earlier run; remove it first"
    data: dict[str, Any] = yaml.safe_load(lab.inventory.read_text())
    data["cluster"]["hf_cache"] = HF_CACHE
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    try:
        result = up(lab, inventory)
        assert result.returncode == 0, explain(result)
        assert pwned_anywhere(lab) == []
        literal = HF_CACHE.replace("~", "/home/nvidia", 1)
        for node in lab.nodes:
            mounts = lab.exec(node, ["docker", "inspect", "-f", "{{json .HostConfig.Binds}}",
                                     CONTAINER], user="nvidia").stdout
            assert literal in mounts.replace("\\u0026", "&"), f"{node}: {mounts}"
            assert lab.exec(node, ["test", "-d", literal], check=False).returncode == 0, \
                f"{node}: the literal directory {literal!r} does not exist"
            tally.add("inputs fuzzed")
    finally:
        converge(lab)
        for node in lab.nodes:
            lab.exec(node, ["rm", "-rf", "--", HF_CACHE.replace("~", "/home/nvidia", 1)],
                     check=False)
    assert pwned_anywhere(lab) == []
