"""sparklab: `python3 -m sglang.launch_server` runs the simulated SGLang server."""
import os
import sys

image = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, image)

from sparklab_engine.sglang_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
