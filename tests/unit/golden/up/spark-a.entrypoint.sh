#!/bin/bash
# Managed by sparkctl: edits here are overwritten by its next run (up, launch).
# Entrypoint of the sparkctl TensorRT-LLM container (mounted read-only from /etc/sparkctl).
# It only runs the sshd that MPI's launcher uses (mpirun -> ssh -> orted); sshd's config, its
# pinned host key and the cluster's authorized key all live in /etc/sparkctl, written by
# `sparkctl up`. If sshd cannot start (bad config, port taken) the container exits, and
# `docker logs` shows why.
set -euo pipefail

CONF=/etc/sparkctl
log() { echo "[sparkctl-entrypoint] $*" >&2; }

find_sshd() {
    command -v sshd 2>/dev/null || { [ -x /usr/sbin/sshd ] && echo /usr/sbin/sshd; } || true
}

SSHD=$(find_sshd)
if [ -z "$SSHD" ]; then
    # Only when the image lacks it: install the distribution's package (no scripts from the web).
    log "sshd is not in the image: installing openssh-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends openssh-server >/dev/null
    SSHD=$(find_sshd)
    [ -n "$SSHD" ] || { log "openssh-server installed but no sshd found"; exit 1; }
fi

# sshd's privilege-separation directory; /run is empty in a new container.
mkdir -p /run/sshd
chmod 0755 /run/sshd

# A session started over ssh gets sshd's environment, not the container's: hand MPI's remote
# orted (and the ranks it starts) the image's PATH/LD_LIBRARY_PATH and the fabric settings.
setenv_args=()
for name in PATH LD_LIBRARY_PATH CPATH TRITON_PTXAS_PATH $(compgen -e | grep -E '^(NCCL|UCX|OMPI|PRTE)_' || true); do
    value=${!name-}
    [ -n "$value" ] || continue
    case $value in
        *\"*|*\\*) log "not forwarding $name to ssh sessions: its value has a quote"; continue ;;
    esac
    setenv_args+=("\"$name=$value\"")
done

if ! "$SSHD" -t -f "$CONF/sshd_config"; then
    log "sshd rejected $CONF/sshd_config (see above)"
    exit 1
fi
log "starting $SSHD with $CONF/sshd_config"
if [ -n "${setenv_args[*]-}" ]; then
    exec "$SSHD" -D -e -f "$CONF/sshd_config" -o "SetEnv ${setenv_args[*]}"
fi
exec "$SSHD" -D -e -f "$CONF/sshd_config"
