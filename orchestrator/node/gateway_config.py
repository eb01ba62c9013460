"""Swap the model list in the gateway's LiteLLM config in place (runs as `python3 -c` on the
gateway's node; stdin: {"path": config file, "model_list": [...], "extra": GatewaySpec.fingerprinted():
host, port, image, node, log config; "salt": the record's new salt, "rounds": PBKDF2 rounds}).

The config holds the master key, which never leaves the node: sparkctl sends only the new
model list, this keeps every other setting (the key too) and rewrites the file (0600,
atomically). Prints {"fingerprint": ...}: the same salted slow hash (PBKDF2-SHA256) `gateway
up` computes for this config (gateway_spec.config_fingerprint),
so a later `gateway up` with the same address and key finds it unchanged. Standard library only.
"""
import hashlib
import json
import os
import sys

a = json.load(sys.stdin)
with open(a["path"]) as handle:
    config = json.load(handle)
config["model_list"] = a["model_list"]
text = json.dumps(config, indent=1, sort_keys=True) + "\n"
temporary = a["path"] + ".new"
fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as handle:
    handle.write(text)
os.chmod(temporary, 0o600)
os.replace(temporary, a["path"])
print(json.dumps({"fingerprint": hashlib.pbkdf2_hmac(
    "sha256", (text + json.dumps(a["extra"])).encode(), a["salt"].encode(),
    int(a["rounds"])).hex()}))
