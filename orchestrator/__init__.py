"""sparkctl: bring up, check, serve on and tear down clusters of NVIDIA DGX Sparks."""

__version__ = "0.1.0"
