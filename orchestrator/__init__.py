"""sparkctl: bring up, check, serve on and tear down clusters of NVIDIA DGX Sparks."""

__version__ = "0.1.0"

import os

# sparkctl uses no pydantic plugins; finding them scans every installed distribution's entry
# points when the first model class is built (~10 ms of each run's start). An owner's own setting
# wins.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
