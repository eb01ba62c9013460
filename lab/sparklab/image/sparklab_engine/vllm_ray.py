"""The simulated vLLM's Ray executor: real Ray placement group, one real actor per rank."""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PG_TIMEOUT = float(os.environ.get("SPARKLAB_VLLM_PG_TIMEOUT", "60"))


def log(level: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) {level} {stamp} [ray_executor.py] {message}",
          file=sys.stderr, flush=True)


@ray.remote(num_cpus=0, num_gpus=1)
class RankWorker:
    """One vLLM worker: on its node, in its Ray worker process (a real process on that node)."""

    def __init__(self, rank: int, model: str) -> None:
        self.rank, self.model = rank, model

    def info(self) -> dict:
        from sparklab_engine.common import ModelMissing, hostname, resolve_model

        try:
            resolve_model(self.model)
            problem = None
        except ModelMissing as exc:
            problem = str(exc)
        return {"rank": self.rank, "host": hostname(), "pid": os.getpid(),
                "ip": ray.util.get_node_ip_address(),
                "vllm_host_ip": os.environ.get("VLLM_HOST_IP"),
                "nccl_ifname": os.environ.get("NCCL_SOCKET_IFNAME"), "problem": problem}

    def load(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def step(self) -> int:
        from sparklab_engine.common import fault

        if fault("rank-die"):
            os._exit(0)
        return self.rank


def placement_strategy() -> str:
    raw = os.environ.get("VLLM_DISTRIBUTED_EXECUTOR_CONFIG") or "{}"
    try:
        options = json.loads(raw).get("placement_group_options") or {}
    except (ValueError, AttributeError):
        raise ValueError(f"VLLM_DISTRIBUTED_EXECUTOR_CONFIG is not a JSON object: {raw!r}") from None
    return str(options.get("strategy") or "PACK")


class RayExecutor:
    def __init__(self, model: str, world: int) -> None:
        self.model, self.world = model, world
        self.workers: list = []
        self.pg = None
        self.dead: str | None = None

    def start(self) -> None:
        try:
            ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        except ConnectionError as exc:
            raise ConnectionError(str(exc)) from None
        gpus = int(ray.cluster_resources().get("GPU", 0))
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        log("INFO", f"Connected to Ray: {len(nodes)} node(s) alive "
            f"({', '.join(n['NodeManagerAddress'] for n in nodes)}), {gpus} GPU(s)")
        if self.world > gpus:
            raise ValueError(
                "The number of required GPUs exceeds the total number of available GPUs in the "
                f"placement group. (tensor_parallel_size x pipeline_parallel_size = {self.world}, "
                f"GPUs in the Ray cluster: {gpus}; is every node's `ray start` in the cluster?)")
        # vLLM's default is PACK; VLLM_DISTRIBUTED_EXECUTOR_CONFIG's placement_group_options
        # can ask for SPREAD (one bundle per one-GPU node), which sparkctl sets
        strategy = placement_strategy()
        log("INFO", f"placement group: {self.world} x {{'GPU': 1}}, strategy {strategy}")
        self.pg = placement_group([{"GPU": 1}] * self.world, strategy=strategy)
        if not self.pg.wait(PG_TIMEOUT):
            raise ValueError(f"Cannot provide a placement group of {self.world} GPU bundles "
                             f"within {PG_TIMEOUT:g} seconds")
        self.workers = [
            RankWorker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=i)).remote(i, self.model)
            for i in range(self.world)]
        infos = ray.get([w.info.remote() for w in self.workers], timeout=120)
        driver_ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
        ips = {i["ip"] for i in infos}
        if driver_ip not in ips:
            raise RuntimeError(f"Error: the driver's IP {driver_ip} (VLLM_HOST_IP) is not among "
                               f"the Ray workers' IPs {sorted(ips)}: VLLM_HOST_IP and the Ray "
                               "node IP must be the same address")
        # like vLLM: the driver's node holds rank 0, then the others by IP
        order = sorted(range(len(infos)), key=lambda k: (infos[k]["ip"] != driver_ip, infos[k]["ip"]))
        self.workers = [self.workers[k] for k in order]
        infos = [dict(infos[k], rank=rank) for rank, k in enumerate(order)]
        for info in infos:
            log("INFO", f"rank {info['rank']} on {info['host']} ({info['ip']}, pid {info['pid']}, "
                f"NCCL_SOCKET_IFNAME={info['nccl_ifname']})")
        missing = [i for i in infos if i["problem"]]
        if missing:
            first = missing[0]
            raise RuntimeError(f"rank {first['rank']} ({first['host']}): {first['problem']}")

    def load(self) -> None:
        ray.get([w.load.remote(0.1) for w in self.workers], timeout=600)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self.dead:
            try:
                ray.get([w.step.remote() for w in self.workers], timeout=30)
            except Exception as exc:  # a rank's process or node is gone
                self.dead = f"a Ray worker died: {type(exc).__name__}"
                log("ERROR", f"EngineCore: {self.dead}; the engine is dead")
                return
            time.sleep(2)

    def step(self) -> None:
        if self.dead:
            raise RuntimeError(self.dead)
        ray.get([w.step.remote() for w in self.workers], timeout=60)

    def shutdown(self) -> None:
        from contextlib import suppress

        for worker in self.workers:
            with suppress(Exception):
                ray.kill(worker)
        if self.pg is not None:
            with suppress(Exception):
                remove_placement_group(self.pg)
        with suppress(Exception):
            ray.shutdown()
