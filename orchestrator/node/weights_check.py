"""Which safetensors files of a model are broken (runs in the server's container as `python3 -c`;
one argument: the model's repo folder in the HF cache, models--ORG--NAME). Each *.safetensors
under its snapshots is read as the format says: an 8-byte little-endian header length, that many
bytes of JSON, then the tensors, whose last data offset must end exactly at the end of the file.
A truncated download, a file cut by a full disk or an HTML error page saved as weights fails one
of these, and the engine's own error (safetensors': "Error while deserializing header: incomplete
metadata") names no file. Prints one line per broken file, "PATH: what is wrong"; nothing when
every file is whole. Standard library only.
"""
import glob
import json
import os
import struct
import sys


def problem(path):
    size = os.path.getsize(path)
    if size < 8:
        return "%d bytes, shorter than the 8-byte header length" % size
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if 8 + length > size:
            return "header of %d bytes but the file has %d: truncated" % (length, size)
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return "its header is not JSON: not a safetensors file"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    data = size - 8 - length
    if ends and max(ends) != data:
        return "the tensors need %d bytes after the header, the file has %d: %s" % (
            max(ends), data, "truncated" if max(ends) > data else "trailing bytes")
    return None


for path in sorted(glob.glob(os.path.join(sys.argv[1], "snapshots", "*", "*.safetensors"))):
    try:
        found = problem(path)
    except OSError as exc:
        found = "cannot be read: %s" % exc
    if found:
        print("%s: %s" % (path, found))
