"""The simulated DGX Spark lab itself: nodes, SSH, sudo, netplan, fabric, faults, teardown."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import LAB_ID, Lab, lab_cli, require_lab_host
from sparklab.identity import LabError
from sparklab.topology import build_plan, parse_ports

# A second lab id for tests that create and destroy their own labs (topologies, teardown).
ALT_ID = int(os.environ.get("SPARKLAB_ALT_ID", str((LAB_ID + 4) % 10)))
NETPLAN = """network:
  version: 2
  ethernets:
    enp1s0f1np1:
      addresses: [{a}]
      mtu: 9000
    enP2p1s0f1np1:
      addresses: [{b}]
      mtu: 9000
"""


@pytest.fixture(scope="module", autouse=True)
def untouched_lab(lab_session: list[Lab]) -> None:
    """These tests look at a lab as `lab up` leaves it (no fabric addresses, no containers);
    other modules share the session's lab and set it up, so start this module from a new one."""
    lab_cli("up", "--force", check=True)
    lab_session[0] = Lab.load(LAB_ID)


# --- pure wiring rules (no root) ---------------------------------------------------------

def test_b2b_addresses_follow_the_contract() -> None:
    plan = build_plan("b2b", None, parse_ports(None))
    assert [n.addresses for n in plan.nodes] == [
        {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24"},
        {"enp1s0f1np1": "192.168.200.13/24", "enP2p1s0f1np1": "192.168.201.13/24"}]
    assert plan.nodes[0].uncabled == ["enp1s0f0np0", "enP2p1s0f0np0"]


def test_ring_gives_each_link_its_own_subnets() -> None:
    plan = build_plan("ring", 3, parse_ports(None))
    subnets = [a.rsplit(".", 1)[0] for n in plan.nodes for a in n.addresses.values()]
    assert all(len(n.cabled) == 4 for n in plan.nodes)
    assert len(set(subnets)) == 6 and all(subnets.count(s) == 2 for s in subnets)


def test_bad_topology_requests_are_user_errors() -> None:
    with pytest.raises(LabError):
        build_plan("b2b", 3, parse_ports(None))
    with pytest.raises(LabError):
        parse_ports("eth0,enp1s0f1np1")


# --- the session lab --------------------------------------------------------------------



@pytest.mark.lab
def test_ssh_with_strict_host_keys_reaches_each_node(lab: Lab) -> None:
    for node in lab.nodes:
        assert lab.ssh(node, "hostname").stdout.strip() == node
    assert lab.ssh(lab.nodes[0], "hostname", user="root").stdout.strip() == lab.nodes[0]


@pytest.mark.lab
def test_nvidia_has_passwordless_sudo_and_docker_group(lab: Lab) -> None:
    out = lab.ssh("spark-a", "sudo -n id -u; id -nG").stdout.split("\n")
    assert out[0] == "0"
    assert {"sudo", "docker"} <= set(out[1].split())
    rule = lab.exec("spark-a", "cat /etc/sudoers.d/sparklab").stdout
    assert "/usr/local/lib/sparklab/dockerd-shim" in rule


@pytest.mark.lab
def test_node_tools_report_the_cabled_twins(lab: Lab) -> None:
    out = lab.ssh("spark-a", "ibdev2netdev").stdout
    assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)" in out
    assert "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)" in out
    assert "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)" in out
    assert "Speed: 200000Mb/s" in lab.ssh("spark-a", "ethtool enp1s0f1np1").stdout
    assert "Speed: Unknown!" in lab.ssh("spark-a", "ethtool enp1s0f0np0").stdout
    csv = lab.ssh("spark-a", "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader")
    assert csv.stdout.startswith("NVIDIA GB10")
    config = lab.exec("spark-a", "cat /var/lib/sparklab/config/lab.json").stdout
    assert '"node": "spark-a"' in config


@pytest.mark.lab
def test_nodes_have_own_filesystem_and_readonly_kernel_knobs(lab: Lab) -> None:
    lab.exec("spark-a", "echo only-a > /etc/sparklab-probe")
    try:
        assert lab.exec("spark-b", "test -e /etc/sparklab-probe", check=False).returncode != 0
        assert not Path("/etc/sparklab-probe").exists()
        denied = lab.exec("spark-a", "echo 10 > /proc/sys/vm/swappiness", check=False)
        assert denied.returncode != 0
    finally:
        lab.exec("spark-a", "rm -f /etc/sparklab-probe")


@pytest.mark.lab
def test_netplan_apply_configures_only_that_node_and_fabric_pings(lab: Lab) -> None:
    try:
        for node, (a, b) in (("spark-a", ("192.168.200.12/24", "192.168.201.12/24")),
                             ("spark-b", ("192.168.200.13/24", "192.168.201.13/24"))):
            lab.exec(node, "cat > /etc/netplan/40-cx7.yaml && chmod 600 /etc/netplan/40-cx7.yaml",
                     input_text=NETPLAN.format(a=a, b=b))
            lab.ssh(node, "sudo netplan apply")
            if node == "spark-a":  # before spark-b applies: only spark-a changed
                addr = lab.exec("spark-a", "ip -br addr show enp1s0f1np1").stdout
                assert "192.168.200.12/24" in addr
                assert "mtu 9000" in lab.exec("spark-a", "ip link show enp1s0f1np1").stdout
                other = lab.exec("spark-b", "ip -br addr; ip link show enp1s0f1np1").stdout
                assert "192.168.200." not in other and "mtu 1500" in other
        ping = lab.ssh("spark-b", "ping -c 2 -W 5 -M do -s 8000 192.168.201.12")
        assert " 0% packet loss" in ping.stdout
    finally:
        for node in lab.nodes:
            lab.exec(node, "rm -f /etc/netplan/40-cx7.yaml; netplan apply; "
                     "for i in enp1s0f1np1 enP2p1s0f1np1; do ip addr flush dev $i scope global;"
                     " ip link set $i mtu 1500; done", check=False)


@pytest.mark.lab
def test_netplan_generate_rejects_a_bad_file(lab: Lab) -> None:
    bad = "network:\n  version: 2\n  ethernets:\n    enp1s0f1np1:\n      mtu: banana\n"
    try:
        lab.exec("spark-a", "cat > /etc/netplan/41-bad.yaml; chmod 600 /etc/netplan/41-bad.yaml",
                 input_text=bad)
        result = lab.ssh("spark-a", "sudo netplan generate", check=False)
        assert result.returncode != 0
        assert "41-bad.yaml" in result.stderr
    finally:
        lab.exec("spark-a", "rm -f /etc/netplan/41-bad.yaml")


@pytest.mark.lab
def test_up_twice_asks_for_down_first(lab: Lab) -> None:
    result = lab.cli("up")
    assert result.returncode == 1
    assert "lab down" in result.stderr


# --- faults -------------------------------------------------------------------------------

@pytest.fixture
def restore_after(lab: Lab):
    yield lab
    lab.cli("fault", "restore", check=True)


@pytest.mark.lab
def test_cut_cable_downs_both_ends_and_restore_reconnects(restore_after: Lab) -> None:
    lab = restore_after
    lab.cli("fault", "cut-cable", "--node", "spark-a", "--interface", "enp1s0f1np1", check=True)
    for node in lab.nodes:
        assert "enp1s0f1np1 (Down)" in lab.exec(node, "ibdev2netdev").stdout
    assert "enP2p1s0f1np1 (Up)" in lab.exec("spark-b", "ibdev2netdev").stdout
    assert "cut-cable" in lab.cli("status").stdout
    lab.cli("fault", "restore", check=True)
    for node in lab.nodes:
        assert "enp1s0f1np1 (Up)" in lab.exec(node, "ibdev2netdev").stdout


@pytest.mark.lab
def test_stop_sshd_refuses_connections(restore_after: Lab) -> None:
    lab = restore_after
    lab.cli("fault", "stop-sshd", "--node", "spark-b", check=True)
    result = lab.ssh("spark-b", "true", check=False)
    assert result.returncode == 255 and "refused" in result.stderr
    lab.cli("fault", "restore", "--node", "spark-b", check=True)
    assert lab.ssh("spark-b", "hostname").stdout.strip() == "spark-b"


@pytest.mark.lab
def test_rotate_hostkey_fails_strict_checking_until_restored(restore_after: Lab) -> None:
    lab = restore_after
    pinned = lab.known_hosts.read_text()
    lab.cli("fault", "rotate-hostkey", "--node", "spark-b", check=True)
    result = lab.ssh("spark-b", "true", check=False)
    assert result.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr
    assert lab.known_hosts.read_text() == pinned
    lab.cli("fault", "restore", check=True)
    assert lab.ssh("spark-b", "hostname").stdout.strip() == "spark-b"


@pytest.mark.lab
def test_occupy_port_binds_and_restore_frees_it(restore_after: Lab) -> None:
    lab = restore_after
    lab.cli("fault", "occupy-port", "--node", "spark-a", "--port", "2233", check=True)
    assert ":2233" in lab.exec("spark-a", "ss -Hltn 'sport = :2233'").stdout
    lab.cli("fault", "restore", check=True)
    lab.exec("spark-a", "for i in $(seq 50); do ss -Hltn 'sport = :2233' | grep -q . || exit 0;"
             " sleep 0.1; done; exit 1")


@pytest.mark.lab
@pytest.mark.lab
def test_occupy_port_on_a_port_in_use_says_it_did_not_take(restore_after: Lab) -> None:
    """Issue #20: against a port already in use (sshd's 22) it reported "injected" while its
    listener failed to bind."""
    lab = restore_after
    result = lab.cli("fault", "occupy-port", "--node", "spark-a", "--port", "22")
    assert result.returncode != 0 and "injected" not in result.stdout
    assert "already in use" in result.stderr and "nothing injected" in result.stderr
    assert "occupy-port" not in lab.cli("status").stdout.split("faults", 1)[-1]


IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"


@pytest.mark.lab
def test_a_file_deleted_on_the_node_is_gone_in_a_container_bind_mount(lab: Lab) -> None:
    """Issue #20: the container's /etc overlay kept serving a file deleted on the node (the HF
    token file). A real bind mount shows the node's directory as it is: opened by name after
    the deletion, the file is not there."""
    lab.exec("spark-a", "docker rm -f e2e-bind >/dev/null 2>&1; mkdir -p /etc/e2e-bind/secrets && "
             "echo e2e-secret > /etc/e2e-bind/secrets/token")
    try:
        lab.exec("spark-a", f"docker run -d --name e2e-bind -v /etc/e2e-bind:/etc/e2e-bind:ro {IMAGE} "
                 "sleep 600")
        seen = lab.exec("spark-a", "docker exec e2e-bind cat /etc/e2e-bind/secrets/token")
        assert seen.stdout.strip() == "e2e-secret"
        lab.exec("spark-a", "rm /etc/e2e-bind/secrets/token")
        after = lab.exec("spark-a", "docker exec e2e-bind cat /etc/e2e-bind/secrets/token", check=False)
        assert after.returncode != 0 and "No such file" in after.stderr, after
        lab.exec("spark-a", "echo replaced > /etc/e2e-bind/secrets/token")
        assert lab.exec("spark-a", "docker exec e2e-bind cat /etc/e2e-bind/secrets/token"
                        ).stdout.strip() == "replaced"
    finally:
        lab.exec("spark-a", "docker rm -f e2e-bind; rm -rf /etc/e2e-bind", check=False)


def test_delay_adds_latency_on_management_and_fabric(restore_after: Lab) -> None:
    lab = restore_after
    lab.cli("fault", "delay", "--node", "spark-a", "--interface", "eth0", "--ms", "80",
            check=True)
    out = lab.exec("spark-b", f"ping -c 3 -q {lab.hosts['spark-a']}").stdout
    # the delay is a lower bound whatever the machine's load
    assert _min_rtt(out) >= 80.0
    lab.exec("spark-a", "ip addr add 192.168.200.12/24 dev enp1s0f1np1")
    lab.exec("spark-b", "ip addr add 192.168.200.13/24 dev enp1s0f1np1")
    try:
        lab.cli("fault", "delay", "--node", "spark-b", "--interface", "enp1s0f1np1",
                "--ms", "40", check=True)
        assert _min_rtt(lab.exec("spark-a", "ping -c 3 -q 192.168.200.13").stdout) >= 40.0
        lab.cli("fault", "restore", check=True)
        assert _min_rtt(lab.exec("spark-a", "ping -c 3 -q 192.168.200.13").stdout) < 40.0
    finally:
        for node in lab.nodes:
            lab.exec(node, "ip addr flush dev enp1s0f1np1 scope global", check=False)


def _min_rtt(ping_output: str) -> float:
    match = re.search(r"= ([\d.]+)/", ping_output)
    assert match, ping_output
    return float(match.group(1))


@pytest.mark.lab
def test_disk_full_and_flag_faults(restore_after: Lab) -> None:
    lab = restore_after
    lab.cli("fault", "disk-full", "--node", "spark-b", check=True)
    lab.cli("fault", "engine-hang", "--node", "spark-b", check=True)
    lab.cli("fault", "rank-die", "--node", "spark-a", check=True)
    df = lab.ssh("spark-b", "df --output=avail,pcent /var | tail -1").stdout.split()
    assert df == ["0", "100%"]
    assert lab.exec("spark-b", "test -e /var/lib/sparklab/faults/engine-hang").returncode == 0
    assert lab.exec("spark-a", "test -e /var/lib/sparklab/faults/rank-die").returncode == 0
    lab.cli("fault", "restore", check=True)
    assert lab.ssh("spark-b", "df --output=pcent /var | tail -1").stdout.strip() != "100%"
    assert lab.exec("spark-b", "ls /var/lib/sparklab/faults").stdout.strip() == ""
    assert lab.exec("spark-b", "test -e /var/lib/sparklab/config/lab.json").returncode == 0


@pytest.mark.lab
def test_change_address_and_set_mtu_are_restored(restore_after: Lab) -> None:
    lab = restore_after
    lab.exec("spark-a", "ip addr add 192.168.200.12/24 dev enp1s0f1np1")
    try:
        lab.cli("fault", "change-address", "--node", "spark-a", "--interface", "enp1s0f1np1",
                "--address", "192.168.200.99/24", check=True)
        lab.cli("fault", "set-mtu", "--node", "spark-a", "--interface", "enp1s0f1np1",
                "--mtu", "4000", check=True)
        shown = lab.exec("spark-a", "ip addr show enp1s0f1np1").stdout
        assert "192.168.200.99/24" in shown and "192.168.200.12/" not in shown
        assert "mtu 4000" in shown
        lab.cli("fault", "restore", check=True)
        shown = lab.exec("spark-a", "ip addr show enp1s0f1np1").stdout
        assert "192.168.200.12/24" in shown and "192.168.200.99" not in shown
        assert "mtu 1500" in shown
    finally:
        lab.exec("spark-a", "ip addr flush dev enp1s0f1np1 scope global", check=False)


# --- labs of their own: topologies and a clean teardown -------------------------------------

def _host_snapshot() -> dict[str, set[str]]:
    def lines(argv: list[str]) -> set[str]:
        return {line.split()[0 if argv[1] == "netns" else 1]
                for line in subprocess.run(argv, capture_output=True, text=True,
                                           check=True).stdout.splitlines() if line.strip()}
    return {"netns": lines(["ip", "netns", "list"]),
            "links": lines(["ip", "-o", "link", "show"]),
            "mounts": set(Path("/proc/mounts").read_text().splitlines())}


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for whichever ancestor reaps orphans on this machine."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.lab
def test_rdma_tools_follow_the_links_and_the_roce_mtu_fault(restore_after: Lab) -> None:
    """ibv_devinfo's active MTU follows the link's (1500 -> 1024, 9000 -> 4096) unless the
    roce-mtu fault pins it; show_gids: the default GID from the MAC at 0/1, each IPv4 address
    as ::ffff:a.b.c.d at 2/3 (RoCE v1, v2), as mlx5 fills them."""
    lab = restore_after
    lab.exec("spark-a", "ip addr add 192.168.200.12/24 dev enp1s0f1np1")
    try:
        info = lab.ssh("spark-a", "ibv_devinfo -d rocep1s0f1").stdout
        assert "hca_id:\trocep1s0f1" in info and "active_mtu:\t\t1024 (3)" in info
        assert "PORT_ACTIVE (4)" in info and "link_layer:\t\tEthernet" in info
        gids = lab.ssh("spark-a", "show_gids rocep1s0f1").stdout.splitlines()
        assert gids[-1] == "n_gids_found=4"
        index3 = gids[-2].split()
        assert index3[:3] == ["rocep1s0f1", "1", "3"] and index3[-3:] == ["192.168.200.12", "v2",
                                                                         "enp1s0f1np1"]
        assert index3[3] == "0000:0000:0000:0000:0000:ffff:c0a8:c80c"
        lab.exec("spark-a", "ip link set dev enp1s0f1np1 mtu 9000")
        assert "active_mtu:\t\t4096 (5)" in lab.ssh("spark-a", "ibv_devinfo -d rocep1s0f1").stdout
        lab.cli("fault", "roce-mtu", "--node", "spark-a", check=True)
        assert "active_mtu:\t\t1024 (3)" in lab.ssh("spark-a", "ibv_devinfo -d rocep1s0f1").stdout
        lab.cli("fault", "restore", check=True)
        assert "active_mtu:\t\t4096 (5)" in lab.ssh("spark-a", "ibv_devinfo -d rocep1s0f1").stdout
        missing = lab.ssh("spark-a", "ibv_devinfo -d mlx5_9", check=False)
        assert missing.returncode != 0 and "mlx5_9" in missing.stderr
    finally:
        lab.exec("spark-a", "ip addr flush dev enp1s0f1np1 scope global; "
                 "ip link set dev enp1s0f1np1 mtu 1500", check=False)


@pytest.mark.lab
def test_down_leaves_nothing_behind() -> None:
    require_lab_host()
    lab_cli("down", lab_id=ALT_ID)
    before = _host_snapshot()
    lab_cli("up", lab_id=ALT_ID, check=True)
    alt = Lab.load(ALT_ID)
    pids = [int(p.read_text().split()[0]) for p in alt.state_dir.glob("nodes/*/*pid")]
    assert len(pids) == 4 and all(_alive(pid) for pid in pids)
    during = _host_snapshot()
    assert {f"sparklab{ALT_ID}-spark-a", f"sparklab{ALT_ID}-spark-b"} <= during["netns"]
    assert alt.ssh("spark-b", "hostname").stdout.strip() == "spark-b"
    lab_cli("down", lab_id=ALT_ID, check=True)
    after = _host_snapshot()
    # this lab's names only (sparklab3 must not match sparklab31's: other labs may come and go)
    ours = re.compile(rf"sparklab{ALT_ID}(?!\d)|/sparklab/{ALT_ID}(?!\d)")
    for key in ("netns", "links", "mounts"):
        assert not {x for x in after[key] - before[key] if ours.search(x)}, key
    assert not any(_alive(pid) for pid in pids)
    assert not alt.state_dir.exists()
    again = lab_cli("down", lab_id=ALT_ID)
    assert again.returncode == 0 and "not up" in again.stdout


@pytest.mark.lab
@pytest.mark.parametrize(("topology", "nodes"), [("ring", 3), ("switch", 4)])
def test_topologies_come_up_and_carry_traffic(topology: str, nodes: int) -> None:
    require_lab_host()
    lab_cli("up", "--force", "--topology", topology, "--nodes", str(nodes), lab_id=ALT_ID,
            check=True)
    try:
        alt = Lab.load(ALT_ID)
        assert alt.nodes == ["spark-a", "spark-b", "spark-c", "spark-d"][:nodes]
        wired = {n["name"]: n["addresses"] for n in alt.data["nodes"]}  # type: ignore[attr-defined]
        last = alt.nodes[-1]
        for node in (alt.nodes[0], last):
            for iface, addr in wired[node].items():
                alt.exec(node, f"ip addr add {addr} dev {iface}")
        if topology == "ring":
            for node in alt.nodes:
                assert alt.exec(node, "ibdev2netdev").stdout.count("(Up)") == 4
        # the last node and the first share a subnet in both topologies
        shared = [(i, a) for i, a in wired[alt.nodes[0]].items()
                  if a.rsplit(".", 1)[0] in {x.rsplit(".", 1)[0] for x in wired[last].values()}]
        assert shared
        target = shared[0][1].split("/")[0]
        ping = alt.ssh(last, f"ping -c 1 -W 5 {target}")
        assert " 0% packet loss" in ping.stdout
    finally:
        lab_cli("down", lab_id=ALT_ID, check=True)
