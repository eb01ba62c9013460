"""sparklab simulation of the `sglang` package: only `python -m sglang.launch_server` (no GPU, no
real model; see docs/lab-engine.md). The implementation is sparklab_engine.sglang_cli."""
__version__ = "0.5.12"
