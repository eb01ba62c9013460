"""The gateway's door to one replica (runs detached on the replica's node as `python3 -c`; one
JSON argument: {"listen": fabric IP, "port": P, "target": engine port on 127.0.0.1,
"state": path of its state file, "pidfile": path, "allow": [the gateway node's address]}).

Only the gateway's node gets in: a connection from any other address is closed before a byte
reaches the engine. The engine behind it may run without a key on its loopback (the safe
default), and the relay binds the fabric address, so without this it would answer every
fabric host with no key while the gateway demands one (issue 41.2).

Engines bind their node's loopback; the gateway on the head reaches a replica at its node's
fabric address through this TCP relay, which is also the switch a rolling relaunch turns:
SIGUSR1 closes the door (the listener stops: new connections are refused, so the router retries
them on another replica; connections in flight carry on), SIGUSR2 opens
it again, SIGTERM ends it. Bytes pass untouched: no HTTP is parsed, no key is seen here.

The state file says {"pid", "accepting", "connections", "busy", "requests", "errors"}:
"requests" counts the exchanges that went through since the relay started (first request bytes
on a connection, or request bytes after answer bytes), "errors" those answered with an HTTP
status of 400 or more (read from the answer's status line, the only bytes looked at) or that
found no engine to connect to: the dashboard rates both between looks. A connection is busy while a
request went up and no answer came back since, or while answer bytes flowed within the last
second (a stream): `drain` waits for busy == 0 before the engine is stopped. While the door is
closed, a kept-alive connection that starts a NEW request (request bytes after answer bytes:
HTTP/1.1 clients send the next request only once the answer is in) is closed before a byte of
it reaches the engine, so the router retries that request on another replica; without this, its
pooled connections would keep a draining replica busy forever. Standard library only
(Python 3.8+).
"""
import asyncio
import contextlib
import json
import os
import signal
import sys
import time

a = json.loads(sys.argv[1])
ALLOW = set(a["allow"]) if a.get("allow") is not None else None
QUIET = 1.0  # seconds without answer bytes after which a finished exchange counts as idle


def failed_answer(data):
    """True when the first bytes of an answer are an HTTP status line of 400 or more."""
    head = data[:16].split(b" ")
    return (len(head) > 1 and head[0].startswith(b"HTTP/") and head[1][:3].isdigit()
            and int(head[1][:3]) >= 400)


class Pipe:
    def __init__(self):
        self.up = 0.0      # last request bytes (client -> engine)
        self.down = 0.0    # last answer bytes (engine -> client)
        self.last = None   # which way bytes went last
        self.writers = []

    def busy(self, now):
        return self.up > self.down or now - self.down < QUIET


class Relay:
    def __init__(self):
        self.server = None
        self.pipes = set()
        self.last = None
        self.requests = 0
        self.errors = 0

    async def open(self):
        if self.server is None:
            self.server = await asyncio.start_server(self.serve, a["listen"], int(a["port"]),
                                                     reuse_address=True)

    async def close(self):
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None

    async def serve(self, reader, writer):
        peer = (writer.get_extra_info("peername") or ("",))[0]
        if ALLOW is not None and peer not in ALLOW:
            writer.close()  # not the gateway: no door around its key
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(a["target"]))
        except OSError:
            self.requests += 1
            self.errors += 1
            writer.close()  # the engine is not there: the gateway sees a reset and retries
            return
        pipe = Pipe()
        pipe.writers = [writer, up_writer]
        self.pipes.add(pipe)
        try:
            await asyncio.gather(self.copy(reader, up_writer, pipe, "up"),
                                 self.copy(up_reader, writer, pipe, "down"))
        finally:
            self.pipes.discard(pipe)
            for w in pipe.writers:
                w.close()

    async def copy(self, source, sink, pipe, direction):
        try:
            while True:
                data = await source.read(65536)
                if not data:
                    break
                if direction == "up" and self.server is None and pipe.last != "up":
                    break  # draining and a new request starts: refused, retried elsewhere
                if pipe.last != direction:  # a new request, or the start of its answer
                    self.count(direction, data)
                setattr(pipe, direction, time.monotonic())
                pipe.last = direction
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in pipe.writers:
                w.close()

    def count(self, direction, data):
        if direction == "up":
            self.requests += 1
        elif failed_answer(data):
            self.errors += 1

    def write_state(self):
        now = time.monotonic()
        busy = sum(1 for p in self.pipes if p.busy(now))
        state = {"pid": os.getpid(), "accepting": self.server is not None,
                 "allow": sorted(ALLOW) if ALLOW is not None else None,
                 "connections": len(self.pipes), "busy": busy,
                 "requests": self.requests, "errors": self.errors}
        if state != self.last:
            tmp = a["state"] + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(state, handle)
            os.replace(tmp, a["state"])
            self.last = state
        if self.server is None:  # draining: idle keep-alive connections are closed
            for pipe in list(self.pipes):
                if not pipe.busy(now):
                    for w in pipe.writers:
                        w.close()


async def main():
    relay = Relay()
    await relay.open()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, lambda: asyncio.ensure_future(relay.close()))
    loop.add_signal_handler(signal.SIGUSR2, lambda: asyncio.ensure_future(relay.open()))
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    with open(a["pidfile"], "w") as handle:
        handle.write(str(os.getpid()))
    while not stop.is_set():
        relay.write_state()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)
    await relay.close()


asyncio.run(main())
