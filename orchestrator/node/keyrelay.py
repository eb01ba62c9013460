"""sparkctl's key-checking relay: the door of a server whose engine takes no API key (runs
detached in the server's container as `python3 -c`; one JSON argument: {"listen": the address
`launch --host` names, "port": the server's port, "target": the engine's inner port on
127.0.0.1, "key_file": the node file of the key (mounted), "open": paths answered without the
key (a trailing * makes a prefix), "pidfile": path, "role": a word for `ps`}).

The engine binds 127.0.0.1:target; this relay binds listen:port and reads each request's head:
a request for an open path, or with `Authorization: Bearer KEY`, goes to the engine with its
body (Content-Length bytes, or chunk by chunk), answers come back untouched (streams too); any
other request gets 401 {"error": "Unauthorized"} (the body vLLM and SGLang answer) and the
connection is closed. Keep-alive connections are checked request by request. The key is read
from its file at start, never from argv. Standard library only (Python 3.8+).
"""
import asyncio
import hmac
import json
import os
import signal
import sys

a = json.loads(sys.argv[1])
MAX_HEAD = 65536
with open(a["key_file"]) as handle:
    KEY = handle.read().strip()
REFUSED = (b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
           b"Content-Length: 25\r\nConnection: close\r\n\r\n{\"error\": \"Unauthorized\"}")


def is_open(path):
    path = path.split("?", 1)[0]
    return any(path.startswith(p[:-1]) if p.endswith("*") else path == p for p in a["open"])


def allowed(head):
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 2:
        return False, {}
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if parts[0] == "OPTIONS" or is_open(parts[1]):
        return True, headers
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), KEY.encode()), headers


async def body(reader, writer, headers):
    """Pass one request's body: Content-Length bytes, or chunks up to the last one."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = await reader.readline()
            writer.write(line)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, up to the empty line
                    line = await reader.readline()
                    writer.write(line)
                    if line in (b"\r\n", b"\n", b""):
                        return
            writer.write(await reader.readexactly(size + 2))
            await writer.drain()
    left = int(headers.get("content-length") or 0)
    while left > 0:
        data = await reader.read(min(left, 65536))
        if not data:
            return
        writer.write(data)
        left -= len(data)
        await writer.drain()


async def down(source, sink):
    try:
        while True:
            data = await source.read(65536)
            if not data:
                break
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        sink.close()


async def serve(reader, writer):
    up_writer = pump = None
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            ok, headers = allowed(head)
            if not ok:
                writer.write(REFUSED)
                await writer.drain()
                return
            if up_writer is None:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(a["target"]))
                pump = asyncio.ensure_future(down(up_reader, writer))
            up_writer.write(head)
            await body(reader, up_writer, headers)
            await up_writer.drain()
    except (ConnectionError, OSError, ValueError, asyncio.IncompleteReadError):
        pass
    finally:
        if up_writer is not None:
            up_writer.close()  # the engine's side ends, so the answer pump ends too
        if pump is not None:
            await asyncio.gather(pump, return_exceptions=True)
        writer.close()


async def main():
    server = await asyncio.start_server(serve, a["listen"], int(a["port"]), reuse_address=True,
                                        limit=MAX_HEAD)
    with open(a["pidfile"], "w") as handle:
        handle.write(str(os.getpid()))
    stop = asyncio.Event()
    asyncio.get_event_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
