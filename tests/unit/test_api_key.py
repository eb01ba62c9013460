"""`launch --host` beyond loopback: refused without --api-key-file (exit 2, before anything
happens), and refused with one for an engine that takes no key; the key file is checked like a
private key and never shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_cli import executed, inv, sparkctl  # noqa: F401  (fixtures)

from orchestrator.cli.api_key import check_bind, is_loopback, read_api_key
from orchestrator.errors import InputError


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True),
                                                ("::1", True), ("127.1.2.3", True),
                                                ("0.0.0.0", False), ("192.168.1.5", False),
                                                ("spark-a", False), ("::", False)])
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def key_file(tmp_path: Path, text: str = "sk-local-123\n", mode: int = 0o600) -> Path:
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_key_file_rules(tmp_path: Path) -> None:
    assert read_api_key(str(key_file(tmp_path))).reveal() == "sk-local-123"
    with pytest.raises(InputError, match="readable by group or others"):
        read_api_key(str(key_file(tmp_path, mode=0o644)))
    with pytest.raises(InputError, match="printable ASCII without spaces") as bad:
        read_api_key(str(key_file(tmp_path, "two words")))
    assert "two" not in str(bad.value)
    with pytest.raises(InputError, match="not found"):
        read_api_key(str(tmp_path / "none"))


@pytest.mark.parametrize("text", ["#sk-local-123\n", "sk-lökal-123\n", "sk-local\u00a0123\n",
                                  "sk-one\nsk-two\n", "\n", "sk-\x7flocal-123\n"])
def test_one_key_rule_for_launch_and_the_gateway(tmp_path: Path, text: str) -> None:
    # issue 41: a `#` line is a comment to llama-server's --api-key-file (it then ran with no
    # key while status said "with API key"); a non-ASCII key was accepted, then readiness
    # waited the whole --timeout (no client can send it in a header)
    from orchestrator.cli.gateway import read_key_file

    for reader in (read_api_key, read_key_file):
        with pytest.raises(InputError) as bad:
            reader(str(key_file(tmp_path, text)))
        assert bad.value.exit_code == 2 and str(tmp_path / "key") in str(bad.value)
        assert "local" not in str(bad.value)


def test_a_recorded_key_breaking_the_rule_is_refused_when_read_from_its_node() -> None:
    from orchestrator.engines.apikey import read_node_key
    from orchestrator.errors import SparkctlError
    from orchestrator.records import ServerRecord

    class Node:
        node = "spark-a"

        def run(self, *args: object, **kwargs: object) -> object:
            return type("R", (), {"ok": True, "stdout": "#sk-commented\n", "stderr": ""})()

    with pytest.raises(SparkctlError, match="must not start with '#'") as bad:
        read_node_key(Node(), ServerRecord(  # type: ignore[arg-type]
            name="s", engine="sglang", recipe="s", model="m", port=1, nodes=["spark-a"],
            config_hash="", api_key_file="/run/k"))
    assert "commented" not in str(bad.value)


def test_bind_rules(tmp_path: Path) -> None:
    from orchestrator.engines.apikey import KeyWay

    way = KeyWay("its own flag", ("/health",))
    assert check_bind("127.0.0.1", None, way, "vLLM") is None
    with pytest.raises(InputError, match="pass --api-key-file"):
        check_bind("0.0.0.0", None, way, "vLLM")
    key = check_bind("0.0.0.0", str(key_file(tmp_path)), way, "vLLM")
    assert key is not None and key.reveal() == "sk-local-123" and "sk-" not in repr(key)
    # a key on loopback protects it too; an engine without a way refuses the key either way
    assert check_bind("127.0.0.1", str(key_file(tmp_path)), way, "vLLM") is not None
    for host in ("0.0.0.0", "127.0.0.1"):
        with pytest.raises(InputError, match="does not pass an API key to its server"):
            check_bind(host, str(key_file(tmp_path)), None, "Nothing")


def test_launch_beyond_loopback_without_a_key_exits_2_before_anything(
        inv: str, executed: dict[str, Any]) -> None:  # noqa: F811
    result = sparkctl("launch", "qwen3-8b", "-i", inv, "--yes", "--host", "0.0.0.0")
    assert result.exit_code == 2 and "--api-key-file" in result.stderr
    assert "request" not in executed and "memory:" not in result.stderr
    shown = sparkctl("launch", "--help")
    assert "--api-key-file" in shown.stdout
