"""A node script's one line of input, and its watch on the controller (stdlib only).

Sent to the nodes in front of fanout.py and imagecopy.py (they are one `python3 -c` text each).
The controller writes one line on the script's stdin (a plan, a job, a one-time token). With
"watch" it keeps stdin open for the whole run, so the end of stdin means the controller is gone
(Ctrl-C, a lost SSH connection): the script kills what it started (`docker save`, `docker
load`) and exits at once. It must notice by itself: `docker exec` does not end a process whose
client went away, and a process under an SSH session only notices when it next writes.
"""
import contextlib
import os
import sys
import threading

FINISHED = threading.Event()
"""Set once the script printed its last line: the controller may close stdin from then on."""
CHILDREN: list = []
"""Processes the script started, killed with it when the controller goes away."""


def read_line(watch):
    """The controller's one line ("" when it closed stdin without one); with `watch`, from now
    on the end of stdin ends this process."""
    line = sys.stdin.readline()
    if watch and line.strip():
        threading.Thread(target=_exit_when_stdin_ends, daemon=True).start()
    return line


def _exit_when_stdin_ends():
    sys.stdin.read()
    if FINISHED.is_set():
        return
    for child in CHILDREN:
        with contextlib.suppress(OSError):
            child.kill()
    os._exit(9)
