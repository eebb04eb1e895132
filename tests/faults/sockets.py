"""The TCP connections a process holds open, read from /proc: each socket file descriptor matched by
inode to its line in /proc/net/tcp(6). A connection the gateway forgot to close is still an fd here,
whatever its TCP state (ESTABLISHED, CLOSE_WAIT...), which is what makes this a leak check."""

from __future__ import annotations

import os
from dataclasses import dataclass

STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


@dataclass(frozen=True)
class Connection:
    local_port: int
    remote_port: int
    state: str


def _table(pid: int) -> dict[str, Connection]:
    by_inode = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            by_inode[inode] = Connection(
                int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16), STATES.get(state, state)
            )
    return by_inode


def held_connections(pid: int | None = None) -> list[Connection]:
    """The TCP sockets ``pid`` (this process by default) has open file descriptors for."""
    pid = os.getpid() if pid is None else pid
    inodes = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            inodes.append(target[8:-1])
    table = _table(pid)
    return [table[inode] for inode in inodes if inode in table]


def connections_to(port: int, pid: int | None = None) -> list[Connection]:
    """Open connections from ``pid`` to a server on ``port`` (the client's side of them)."""
    return [c for c in held_connections(pid) if c.remote_port == port]
