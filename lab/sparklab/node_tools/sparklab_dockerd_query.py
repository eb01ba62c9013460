"""Read-only commands: ps, inspect, logs, and the Go-template subset they format with."""
from __future__ import annotations

import json
import sys
import time

from sparklab_dockerd_run import split_flags
from sparklab_dockerd_state import (
    DockerError,
    all_containers,
    cdir,
    find,
    image_record,
    load,
    normalize_image,
    parse_iso,
)


def running(c: dict, ref: str) -> int:
    if not c["State"].get("Running"):
        raise DockerError(f"Error response from daemon: container {c['Id']} is not running", 1)
    return int(c["State"]["Pid"])


def status_text(c: dict) -> str:
    s = c["State"]
    if s.get("Running"):
        return "Up " + ago(parse_iso(s["StartedAt"]), suffix="")
    if s.get("Status") == "created":
        return "Created"
    return f"Exited ({s.get('ExitCode', 0)}) " + ago(parse_iso(s["FinishedAt"]))


def ago(t: float, suffix: str = " ago") -> str:
    secs = max(0, int(time.time() - t))
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if secs >= size * 2 or (unit != "days" and secs >= size and unit == "minutes"):
            n = secs // size
            return f"{n} {unit if n > 1 else unit[:-1]}{suffix}"
    return ("Less than a second" if secs < 1 else f"{secs} seconds") + suffix


def ps_row(c: dict) -> dict:
    command = " ".join(c["sparklab"]["argv"])
    return {"Command": json.dumps(command[:20] + ("…" if len(command) > 20 else ""),
                                  ensure_ascii=False),
            "CreatedAt": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC",
                                       time.gmtime(parse_iso(c["Created"]))),
            "ID": c["Id"][:12], "Image": c["Config"]["Image"],
            "Labels": ",".join(f"{k}={v}" for k, v in c["Config"]["Labels"].items()),
            "LocalVolumes": "0", "Mounts": ",".join(m["Source"] for m in c["Mounts"]),
            "Names": c["Name"][1:], "Networks": c["HostConfig"]["NetworkMode"], "Ports": "",
            "RunningFor": ago(parse_iso(c["Created"])), "Size": "0B",
            "State": c["State"].get("Status", "created"), "Status": status_text(c)}


def matches(c: dict, filters: list[str]) -> bool:
    for flt in filters:
        key, _, val = flt.partition("=")
        labels = c["Config"]["Labels"]
        if key == "label":
            k, eq, v = val.partition("=")
            if k not in labels or (eq and labels[k] != v):
                return False
        elif key == "name":
            import re

            if not re.search(val.replace("^/", "^"), c["Name"][1:]):
                return False
        elif key == "status":
            if c["State"].get("Status") != val:
                return False
        elif key == "id":
            if not c["Id"].startswith(val):
                return False
        elif key == "ancestor":
            if c["Config"]["Image"] != val:
                return False
        else:
            raise DockerError(f"Error response from daemon: invalid filter '{key}'", 1)
    return True


def render(template: str, obj: object) -> str:
    import re

    def lookup(expr: str) -> object:
        expr = expr.strip()
        fn, _, arg = expr.partition(" ")
        if fn == "json":
            return json.dumps(lookup(arg), separators=(",", ":"))
        if fn == "index":
            base, key = arg.rsplit(" ", 1)
            val, key = lookup(base), json.loads(key)
            if isinstance(val, list) and isinstance(key, int):
                return val[key] if -len(val) <= key < len(val) else ""
            return val.get(key, "") if isinstance(val, dict) else ""
        if fn == "join":
            base, sep = arg.rsplit(" ", 1)
            return json.loads(sep).join(lookup(base) or [])
        if expr == ".":
            return obj
        if not expr.startswith("."):
            raise DockerError(f'template parsing error: template: :1: function "{fn}" '
                              "not defined", 1)
        val: object = obj
        for part in expr[1:].split("."):
            val = val.get(part, "<no value>") if isinstance(val, dict) else "<no value>"
        return val

    def fmt(m: re.Match) -> str:
        val = lookup(m.group(1))
        if isinstance(val, bool):
            return "true" if val else "false"
        if val is None:
            return "<nil>"
        if isinstance(val, list):
            return "[" + " ".join(map(str, val)) + "]"
        if isinstance(val, dict):
            return "map[" + " ".join(f"{k}:{v}" for k, v in val.items()) + "]"
        return str(val)

    return re.sub(r"\{\{(.*?)\}\}", fmt, template.replace("\\t", "\t").replace("table ", ""))


def cmd_ps(args: list[str]) -> int:
    opts, _rest = split_flags(args, {"--filter", "-f", "--format", "-n", "--last"},
                             {"-a", "--all", "-q", "--quiet", "--no-trunc", "-s", "--size",
                              "-aq", "-qa"}, "ps")
    flags = {f for f, _ in opts}
    every = bool(flags & {"-a", "--all", "-aq", "-qa"})
    filters = [v or "" for f, v in opts if f in ("--filter", "-f")]
    fmt = next((v for f, v in reversed(opts) if f == "--format"), None)
    rows = [c for c in all_containers()
            if (every or c["State"].get("Running")) and matches(c, filters)]
    if flags & {"-q", "--quiet", "-aq", "-qa"}:
        fmt = "{{.ID}}"
    if fmt:
        for c in rows:
            print(render(fmt, ps_row(c)))
        return 0
    cols = ("CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES")
    table = [[r["ID"], r["Image"], r["Command"], r["RunningFor"], r["Status"], "", r["Names"]]
             for r in map(ps_row, rows)]
    widths = [max([len(cols[i])] + [len(t[i]) for t in table]) + 3 for i in range(7)]
    for line in [list(cols), *table]:
        print("".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    return 0


def public(c: dict) -> dict:
    out = {k: v for k, v in c.items() if k != "sparklab"}
    out["State"] = {k: c["State"].get(k, d) for k, d in
                    (("Status", "created"), ("Running", False), ("Paused", False),
                     ("Restarting", False), ("OOMKilled", False), ("Dead", False), ("Pid", 0),
                     ("ExitCode", 0), ("Error", ""), ("StartedAt", ""), ("FinishedAt", ""))}
    out["LogPath"] = cdir(c["Id"]) + "/log"
    return out


def cmd_inspect(args: list[str], kind: str = "container") -> int:
    opts, rest = split_flags(args, {"-f", "--format", "--type"}, {"-s", "--size"}, "inspect")
    fmt = next((v for f, v in reversed(opts) if f in ("-f", "--format")), None)
    if not rest:
        raise DockerError('"docker inspect" requires at least 1 argument.', 1)
    found, code = [], 0
    for ref in rest:
        obj = None
        if kind in ("container", "any"):
            try:
                obj = public(find(ref))
            except DockerError:
                obj = None
        if obj is None and kind in ("image", "any"):
            obj = image_record(normalize_image(ref))
        if obj is None:
            print(f"Error: No such {'image' if kind == 'image' else 'object'}: {ref}"
                  if kind != "container" else f"Error: No such container: {ref}",
                  file=sys.stderr)
            code = 1
            continue
        found.append(obj)
    if fmt:
        for obj in found:
            print(render(fmt, obj))
    else:
        print(json.dumps(found, indent=4))
    return code


def parse_since(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    if text and text[-1] in units and text[:-1].replace(".", "").isdigit():
        return time.time() - float(text[:-1]) * units[text[-1]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_iso(text if "T" in text else text + "T00:00:00")
    except ValueError as exc:
        raise DockerError(f'invalid value for "since": failed to parse value as time or '
                          f'duration: "{text}"', 1) from exc


def cmd_logs(args: list[str]) -> int:
    opts, rest = split_flags(args, {"--tail", "-n", "--since", "--until"},
                             {"-f", "--follow", "-t", "--timestamps", "--details"}, "logs")
    if len(rest) != 1:
        raise DockerError('"docker logs" requires exactly 1 argument.', 1)
    c = find(rest[0])
    flags = {f for f, _ in opts}
    tail = next((v for f, v in reversed(opts) if f in ("--tail", "-n")), "all")
    since = next((parse_since(v or "") for f, v in reversed(opts) if f == "--since"), 0.0)
    stamps = bool(flags & {"-t", "--timestamps"})
    path = cdir(c["Id"]) + "/log"

    def emit(line: str) -> None:
        try:
            rec = json.loads(line)
        except ValueError:
            return
        if since and parse_iso(rec["time"]) < since:
            return
        stream = sys.stdout if rec["stream"] == "stdout" else sys.stderr
        stream.write((rec["time"] + " " if stamps else "") + rec["log"])
        stream.flush()

    try:
        f = open(path)  # noqa: SIM115 (kept open while following)
    except OSError:
        return 0
    with f:
        lines = f.readlines()
        if tail != "all":
            lines = lines[-int(tail):] if int(tail or 0) > 0 else []
        for line in lines:
            emit(line)
        if not flags & {"-f", "--follow"}:
            return 0
        buf = ""
        while True:
            chunk = f.readline()
            if chunk:
                buf += chunk
                if buf.endswith("\n"):
                    emit(buf)
                    buf = ""
                continue
            try:
                running_now = bool(load(c["Id"])["State"].get("Running"))
            except KeyError:
                running_now = False
            if not running_now:
                # The monitor writes every line before it marks the container exited.
                for line in (buf + f.read()).splitlines(keepends=True):
                    emit(line)
                return 0
            time.sleep(0.2)


def cmd_inspect_any(args: list[str]) -> int:
    return cmd_inspect(args, "any")
