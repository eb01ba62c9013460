"""The nodes vLLM's Ray cluster knows, as its head sees them (runs in the server's first
container as `python3 -c`, with the image's python3, which has Ray; no argument). Prints one
JSON line: {"nodes": [{"ip", "alive", "host", "gpus"}]}, or {"error": why}."""
import json

try:
    import ray  # type: ignore[import-not-found]  # the image's, not the controller's

    ray.init(address="auto", logging_level="ERROR", log_to_driver=False, configure_logging=False)
    nodes = [{"ip": n.get("NodeManagerAddress"), "alive": bool(n.get("Alive")),
              "host": n.get("NodeManagerHostname"),
              "gpus": (n.get("Resources") or {}).get("GPU", 0)} for n in ray.nodes()]
    ray.shutdown()
    print(json.dumps({"nodes": nodes}))
except Exception as exc:
    print(json.dumps({"error": ("%s: %s" % (type(exc).__name__, exc))[:600]}))
