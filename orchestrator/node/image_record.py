"""What a throw-away container of an image said, turned into the node's record of that image
(runs on the node as `python3 -c`; see phases/image_records.py). Standard library only.

`image_record.py JSON`, JSON = {"kind": "mpi" or "ray", "image": ..., "image_id": ...}; stdin is
the probe's output (`mpirun --version`, or `ray --version` / `no-ray`). Prints the record's JSON
on one line; exits 3 with the probe's tail on stderr when the output is not what the kind expects
(a broken image must not be recorded as "no Open MPI" or "no Ray").
"""
import datetime
import json
import re
import sys

# `mpirun (Open MPI) 5.0.11` anywhere in the output (an image's banner may come first); the
# controller parses versions with the same pattern (engines' mpi_env, a unit test compares)
MPI_VERSION = r"\(Open MPI\)\s+(\d+)\.(\d+)(?:\.(\d+))?"
RAY_VERSION = r"ray, version (\S+)"


def unexpected(why, out):
    sys.stderr.write(why + ":\n" + out[-800:])
    sys.exit(3)


def mpi_fields(out):
    match = re.search(MPI_VERSION, out)
    if not match:
        unexpected("no Open MPI version in `mpirun --version`", out)
    version = ".".join(part for part in match.groups() if part)
    return {"implementation": "Open MPI", "version": version, "major": int(match.group(1))}


def ray_fields(out):
    match = re.search(RAY_VERSION, out)
    if not match and "no-ray" not in out:
        unexpected("unexpected answer", out)
    return {"ray": match.group(1) if match else None}


KINDS = {"mpi": mpi_fields, "ray": ray_fields}


def record(request, out):
    fields = KINDS[request["kind"]](out)
    detected = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"image": request["image"], "image_id": request["image_id"], **fields,
            "detected": detected}


if __name__ == "__main__":
    print(json.dumps(record(json.loads(sys.argv[1]), sys.stdin.read())))
