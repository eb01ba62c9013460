# ruff: noqa: UP031  (printf formats on purpose: they mirror nccl-tests' src/util.cu)
"""Simulated nccl-tests `all_gather_perf`: real output format, figures from a real lab transfer.

Ranks come from OMPI_COMM_WORLD_RANK/SIZE (mpirun, one rank per node). Rank 1 sends rank 0
a real TCP stream over the interface NCCL_SOCKET_IFNAME selects (bound to its address); rank 0
times it. The measured rate is mapped to a Spark figure (every constant is explained in
docs/lab-engine.md, "all_gather_perf"):

    busbw = SPARK_BUSBW * min(1, measured / LAB_LINE_GBPS) * hca_factor * mtu_factor
    algbw = busbw * n / (n - 1)        (nccl-tests: all_gather busbw = algbw * (n-1)/n)
    time  = size / algbw

Only rank 0 prints, like nccl-tests (other ranks' device lines reach it through the socket).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

from .common import NcclError, hostname, leader_address, nccl_interface, nccl_log

SPARK_BUSBW = 23.7  # GB/s: two Sparks, one cable, NCCL release build (NVIDIA's NCCL playbook)
PARTIAL_HCA_BUSBW = 3.0  # GB/s: "busbw stuck at ~3 GB/s" with part of the link (same source)
LAB_LINE_GBPS = 1.0  # the lab link's stand-in for the 200 Gb/s line rate (1:200 model)
LAB_SCALE = 32  # the lab transfers size/LAB_SCALE bytes per measurement
ROCE_MTUS = (4096, 2048, 1024, 512, 256)
ROCE_HEADROOM = 100  # Ethernet MTU needed above the RoCE MTU (Eth/IP/UDP/BTH/ICRC headers)
NCCL_VERSION_CODE = 22707  # the lab claims NCCL 2.27.7 (X*10000 + Y*100 + Z)
TESTS_VERSION = "2.19.6"
SPARK_FABRIC = {"enp1s0f0np0": "rocep1s0f0", "enp1s0f1np1": "rocep1s0f1",
                "enP2p1s0f0np0": "roceP2p1s0f0", "enP2p1s0f1np1": "roceP2p1s0f1"}


def parse_size(text: str) -> int:
    """nccl-tests' parsesize: K/M/G suffixes are powers of 1024."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_args(argv: list[str]) -> dict:
    opts = {"b": 32 << 20, "e": 32 << 20, "f": 1, "g": 1, "w": 1, "n": 20}
    names = {"-b": "b", "--minbytes": "b", "-e": "e", "--maxbytes": "e", "-f": "f",
             "--stepfactor": "f", "-g": "g", "--ngpus": "g", "-w": "w", "-n": "n"}
    i = 0
    while i < len(argv):
        key = names.get(argv[i])
        if key is None or i + 1 >= len(argv):
            i += 1
            continue
        value = argv[i + 1]
        opts[key] = parse_size(value) if key in "be" else int(value)
        i += 2
    return opts


def sizes(opts: dict) -> list[int]:
    out, size = [], opts["b"]
    while size <= opts["e"]:
        out.append(size)
        size = size * opts["f"] if opts["f"] > 1 else opts["e"] + 1
    return out


# ------------------------------------------------------------------ the model
def _sys(interface: str, name: str) -> str:
    try:
        with open(f"/sys/class/net/{interface}/{name}") as f:
            return f.read().strip()
    except OSError:
        return ""


def available_devices() -> list[str]:
    """RoCE devices of the Spark fabric interfaces that have carrier (ibdev2netdev's Up)."""
    return [dev for iface, dev in SPARK_FABRIC.items() if _sys(iface, "carrier") == "1"]


def used_devices(available: list[str], spec: str) -> list[str]:
    """NCCL_IB_HCA: unset = all; `^a,b` excludes; `=a` exact; else prefixes; `:port` dropped."""
    if not spec:
        return list(available)
    exclude = spec.startswith("^")
    names = [p.split(":")[0] for p in spec.lstrip("^=").split(",") if p]
    exact = spec.startswith("=")
    hit = [d for d in available if any(d == n if exact else d.startswith(n) for n in names)]
    return [d for d in available if d not in hit] if exclude else hit


def hca_factor(available: list[str], used: list[str]) -> float:
    if available and len(used) >= len(available):
        return 1.0
    return PARTIAL_HCA_BUSBW / SPARK_BUSBW


def roce_mtu(mtu: int) -> int:
    return next((m for m in ROCE_MTUS if mtu >= m + ROCE_HEADROOM), ROCE_MTUS[-1])


def mtu_factor(mtu: int) -> float:
    return roce_mtu(mtu) / ROCE_MTUS[0]


def figures(size: int, measured_gbps: float, nranks: int, hca: float, mtu: float) -> tuple:
    """(time us, algbw GB/s, busbw GB/s) for one row half."""
    if nranks < 2:
        return 0.0, 0.0, 0.0
    busbw = SPARK_BUSBW * min(1.0, measured_gbps / LAB_LINE_GBPS) * hca * mtu
    algbw = busbw * nranks / (nranks - 1)
    return size / (algbw * 1e9) * 1e6 if algbw else 0.0, algbw, busbw


# ------------------------------------------------------------------ output (nccl-tests' formats)
def float_str(value: float, width: int) -> str:
    for fmt in (f"%{width}.2f", f"%{width}.1f", f"%{width}.0f"):
        text = fmt % value
        if len(text) <= width:
            return text
    return (f"%{width}.1e" if width >= 7 else f"%{width}.0e") % value


def header(opts: dict, device_lines: list[str]) -> list[str]:
    step = f"{opts['f']}(factor)" if opts["f"] > 1 else f"{opts['e']}(bytes)"
    return [
        f"# nccl-tests version {TESTS_VERSION} nccl-headers={NCCL_VERSION_CODE} "
        f"nccl-library={NCCL_VERSION_CODE}",
        "# Collective test starting: all_gather_perf",
        f"# nThread 1 nGpus {opts['g']} minBytes {opts['b']} maxBytes {opts['e']} step: {step} "
        f"warmup iters: {opts['w']} iters: {opts['n']} agg iters: 1 validation: 1 graph: 0 "
        "unalign: 0",
        "#",
        "# Using devices",
        *device_lines,
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
        % ("", "", "", "", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s"
        % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
           "algbw", "busbw", "#wrong", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s"
        % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
           "(GB/s)", "", ""),
    ]


def row(size: int, nranks: int, halves: list[tuple]) -> str:
    count = size // 4 // max(nranks, 1)  # float elements per rank (paramcount in nccl-tests)
    line = "%12d  %12d  %8s  %6s  %6s" % (size, count, "float", "none", "%6i" % -1)
    for usec, algbw, busbw in halves:
        line += "  %7s  %6s  %6s  %6g" % (float_str(usec, 7), float_str(algbw, 6),
                                          float_str(busbw, 6), 0)
    return line


def device_line(rank: int, pid: int, host: str) -> str:
    return "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s" % (
        rank, 0, pid, host, 0, 0x000f, 0x01, 0x00, "NVIDIA GB10")


def footer(avg: float) -> list[str]:
    return ["# %-20s : %d %s" % ("Out of bounds values", 0, "OK"),
            "# %-20s : %g %s" % ("Avg bus bandwidth", avg, ""), "#",
            "# Collective test concluded: all_gather_perf", "#", ""]


# ------------------------------------------------------------------ the transfer
def port() -> int:
    return int(os.environ.get("SPARKLAB_NCCLTEST_PORT", "29531"))


def deadline() -> float:
    return time.monotonic() + float(os.environ.get("SPARKLAB_NCCLTEST_TIMEOUT", "60"))


def local_view(ifname: str) -> dict:
    """What this rank's NCCL would run on: its RoCE devices and the MTU of its interface."""
    available = available_devices()
    used = used_devices(available, os.environ.get("NCCL_IB_HCA", ""))
    if os.environ.get("NCCL_DEBUG", "").upper() == "INFO":
        listed = " ".join(f"[{i}]{d}:1/RoCE" for i, d in enumerate(used))
        nccl_log("INFO", f"NET/IB : Using {listed or 'no device'}")
    mtu = int(_sys(ifname, "mtu") or 1500)
    return {"hca": hca_factor(available, used), "mtu": mtu, "used": used}


def _lines(sock: socket.socket):
    return sock.makefile("rw")


def leader(world: int, opts: dict, ifname: str, addr: str) -> int:
    me = local_view(ifname)
    target = leader_address()
    listen = target if target == addr or _is_local(target) else addr
    server = socket.create_server((listen, port()))
    until = deadline()
    peers: dict[int, tuple] = {}
    while len(peers) < world - 1:
        server.settimeout(max(0.1, until - time.monotonic()))
        try:
            sock, _ = server.accept()
        except TimeoutError:
            raise NcclError(f"NCCL error: remote process exited or there was a network error "
                            f"(sparklab: only {len(peers) + 1} of {world} ranks joined)") from None
        sock.settimeout(60)
        stream = _lines(sock)
        hello = json.loads(stream.readline())
        peers[int(hello["rank"])] = (sock, stream, hello)
    nccl_log("INFO", f"Bootstrap : Using {ifname}:{addr}<0>")
    devices = [device_line(0, os.getpid(), hostname())]
    devices += [device_line(r, int(p[2]["pid"]), str(p[2]["host"])) for r, p in sorted(peers.items())]
    print("\n".join(header(opts, devices)), flush=True)
    hca = min([me["hca"]] + [p[2]["hca"] for p in peers.values()])
    mtu = min([me["mtu"]] + [int(p[2]["mtu"]) for p in peers.values()])
    total, count = 0.0, 0
    for size in sizes(opts):
        halves = []
        for _ in ("out-of-place", "in-place"):
            gbps = _measure(peers.get(1), max(4096, size // LAB_SCALE)) if 1 in peers else 0.0
            half = figures(size, gbps, world, hca, mtu_factor(mtu))
            halves.append(half)
            total, count = total + half[2], count + 1
        print(row(size, world, halves), flush=True)
    for sock, stream, _ in peers.values():
        stream.write("bye\n")
        stream.flush()
        sock.close()
    print("\n".join(footer(total / count if count else 0.0)), flush=True)
    return 0


def _is_local(address: str) -> bool:
    try:
        with socket.socket() as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def _measure(peer: tuple | None, nbytes: int) -> float:
    """Ask rank 1 for `nbytes` and time their arrival (one round trip included, like a collective)."""
    if peer is None:
        return 0.0
    sock, stream, _ = peer
    started = time.perf_counter()
    stream.write(f"send {nbytes}\n")
    stream.flush()
    left = nbytes
    while left > 0:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise NcclError("NCCL error: remote process exited or there was a network error")
        left -= len(chunk)
    seconds = time.perf_counter() - started
    return nbytes * 8 / seconds / 1e9


def worker(rank: int, ifname: str, addr: str) -> int:
    me = local_view(ifname)
    target, until = leader_address(), deadline()
    while True:
        try:
            sock = socket.create_connection((target, port()), timeout=5, source_address=(addr, 0))
            break
        except OSError:
            if time.monotonic() > until:
                raise NcclError(f"NCCL error: remote process exited or there was a network error "
                                f"(sparklab: rank {rank} could not reach rank 0 at "
                                f"{target}:{port()})") from None
            time.sleep(0.2)
    sock.settimeout(120)
    stream = _lines(sock)
    hello = {"rank": rank, "host": hostname(), "pid": os.getpid(), **me}
    stream.write(json.dumps(hello) + "\n")
    stream.flush()
    payload = b"\0" * (1 << 20)
    for line in stream:
        if line.startswith("send "):
            left = int(line.split()[1])
            while left > 0:
                sock.sendall(payload[:min(left, len(payload))])
                left -= min(left, len(payload))
        else:
            break
    sock.close()
    return 0


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print("USAGE: all_gather_perf [-b minbytes] [-e maxbytes] [-f stepfactor] [-g ngpus] ...\n"
              "sparklab simulation: figures come from a real TCP transfer over the lab link "
              "(see docs/lab-engine.md)")
        return 0
    opts = parse_args(argv)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    try:
        ifname, addr = nccl_interface()
        if rank == 0:
            return leader(world, opts, ifname, addr)
        return worker(rank, ifname, addr)
    except (NcclError, OSError, ValueError) as exc:
        print(f"{hostname()}: Test NCCL failure common.cu:1270 '{exc}'", file=sys.stderr, flush=True)
        return 1
