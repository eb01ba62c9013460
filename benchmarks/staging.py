"""The fabric as the benchmarks see it: a node's fabric address, and iperf3 between two nodes
(the raw TCP rate model copies are compared with)."""

from __future__ import annotations

import json
import subprocess
import time

from benchmarks.labctl import SPARKCTL, BenchError, Lab


def fabric_ip(lab: Lab, node: str) -> str:
    data = lab.inventory_data()
    interface = data["fabric"]["interfaces"][0]
    entry = next(n for n in data["nodes"] if n["name"] == node)
    return str(entry["addresses"][interface]).split("/")[0]


def iperf(lab: Lab, client: str, server: str, seconds: int = 3) -> float:
    """Raw TCP throughput client -> server between their first fabric addresses, in MB/s."""
    server_ip, client_ip = fabric_ip(lab, server), fabric_ip(lab, client)
    listener = subprocess.Popen(
        [SPARKCTL, "lab", "exec", server, "--", "timeout", str(seconds + 20), "iperf3", "-s", "-1",
         "-B", server_ip], env=lab.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        answer: dict[str, object] = {}
        for _ in range(50):  # the listener needs a moment to bind
            out = lab.exec(client, f"iperf3 -c {server_ip} -B {client_ip} -t {seconds} -J",
                           check=False)
            answer = json.loads(out) if out.strip().startswith("{") else {}
            if "error" not in answer and answer:
                break
            time.sleep(0.1)
        end = answer.get("end") if isinstance(answer, dict) else None
        if not isinstance(end, dict):
            raise BenchError(f"iperf3 {client} -> {server} gave no result: {answer!r:.300}")
        return float(end["sum_received"]["bits_per_second"]) / 8 / 1e6
    finally:
        try:
            listener.wait(timeout=seconds + 25)
        except subprocess.TimeoutExpired:
            listener.kill()  # our own child, by its handle
            listener.wait()
