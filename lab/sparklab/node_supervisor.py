"""PID 1 of a lab node (runs with the node's /usr/bin/python3, stdlib only).

Starts the node's sshd, then reaps every orphan forever, so daemons started over SSH never
pile up as zombies and the node stays a stable `nsenter -t` target.
"""

import os
import signal
import subprocess
import time


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only `lab down` (SIGKILL) ends a node
    subprocess.run(["/usr/sbin/sshd", "-f", "/etc/ssh/sshd_config",
                    "-E", "/var/log/sparklab-sshd.log"], check=True)
    with open("/run/sparklab/ready", "w") as ready:
        ready.write(f"{time.time()}\n")
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1)


if __name__ == "__main__":
    main()
