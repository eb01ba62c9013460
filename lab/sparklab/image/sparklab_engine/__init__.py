"""sparklab simulation of the TensorRT-LLM container's tools (no GPU, no real model).

Lives only inside lab containers (at /usr/local/lib/sparklab-image); see docs/lab-engine.md.
"""
