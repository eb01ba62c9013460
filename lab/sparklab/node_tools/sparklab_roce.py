"""sparklab simulation: the RoCE side of a Spark's ConnectX-7 for `ibv_devinfo` and `show_gids`.

veth has no RDMA device, so both tools are computed from the node's real links, as the mlx5
driver fills them: one device per fabric interface (rocep1s0f1 <-> enp1s0f1np1, ...), port 1
ACTIVE while the link is up, its active MTU the largest InfiniBand MTU (256..4096) that fits in
the interface's MTU with the RoCE headers (MTU 9000 -> 4096, 1500 -> 1024), and a GID table of
RoCE v1 and v2 entries: the default GID (fe80:: with the port's MAC as EUI-64, there whether or
not the interface has an IPv6 link-local address) at indexes 0 and 1, then each IPv4 address as
an IPv4-mapped GID (::ffff:a.b.c.d) at 2 and 3, 4 and 5, ... The lab fault `roce-mtu` pins a
device's active MTU (a file /var/lib/sparklab/faults/roce-mtu-<device> holding the MTU).
"""
import ipaddress
import json
import os
import subprocess

ROCE = [
    ("rocep1s0f0", "enp1s0f0np0"),
    ("rocep1s0f1", "enp1s0f1np1"),
    ("roceP2p1s0f0", "enP2p1s0f0np0"),
    ("roceP2p1s0f1", "enP2p1s0f1np1"),
]
IB_MTUS = (4096, 2048, 1024, 512, 256)
IB_MTU_CODE = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
ROCE_HEADERS = 100  # Ethernet + IP + UDP + BTH (+ ICRC), rounded up as the driver allows for
FAULTS = "/var/lib/sparklab/faults"


def links():
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    return {link["ifname"]: link for link in json.loads(out)}


def devices():
    """[(device, netdev, link)] for the fabric interfaces this node has."""
    found = links()
    return [(dev, net, found[net]) for dev, net in ROCE if net in found]


def active_mtu(device, link):
    try:
        with open(os.path.join(FAULTS, "roce-mtu-" + device)) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        pass
    mtu = int(link.get("mtu") or 1500)
    return next((m for m in IB_MTUS if m + ROCE_HEADERS <= mtu), 256)


def port_active(link):
    return link.get("operstate") == "UP"


def gid_of(address):
    """A GID as the kernel prints it: eight groups of four hex digits."""
    packed = ipaddress.IPv6Address(address).packed
    return ":".join(packed[i:i + 2].hex() for i in range(0, 16, 2))


def default_gid(mac):
    """fe80::/64 with the MAC as modified EUI-64 (the universal/local bit flipped, ff:fe inside)."""
    octets = [int(part, 16) for part in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 255, 254, *octets[3:]]
    return "fe80::" + ":".join(f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2))


def gids(link):
    """[(index, gid, ipv4 or "", "v1"/"v2")] of one device's port 1."""
    table = []
    infos = link.get("addr_info") or []
    ipv4 = [a["local"] for a in infos if a.get("family") == "inet"]
    entries = [(default_gid(link.get("address") or "00:00:00:00:00:00"), "")]
    entries += [("::ffff:" + address, address) for address in ipv4]
    for address, v4 in entries:
        for version in ("v1", "v2"):
            table.append((len(table), gid_of(address), v4, version))
    return table
