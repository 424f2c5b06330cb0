"""A fake engine process for the fake libdcgm (libdcgm/fake_libdcgm.c, `fake_engine_process`): it
answers every request the library sends it on a Unix socket, so that a test can stop the engine as a
wedged nv-hostengine stops (SIGSTOP: every DCGM call waits), continue it (SIGCONT: the calls waiting
are answered) or kill it (an engine that died). Run as `python engine_process.py SOCKET`; `Engine`
starts and controls one."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def serve(path: str) -> None:
    """Echo each byte of each connection until killed; ready once the socket exists."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(512)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                conn, _ = listener.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(64)
                if data:
                    sock.sendall(data)
                    continue
            except OSError:
                pass
            sel.unregister(sock)
            sock.close()


class Engine:
    """The process, started on `path`; stop()/cont() as a wedge and its end, kill() as a death."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen([sys.executable, __file__, str(path)])
        deadline = time.monotonic() + 20
        while not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise RuntimeError("the fake engine process did not start")
            time.sleep(0.01)

    def _answers(self) -> bool:
        """The process echoes a byte: it is in its loop (the socket file alone only says bound; on a
        busy machine the first DCGM call could wait past a short test bound for the loop to start)."""
        if not self.path.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(5)
                probe.connect(str(self.path))
                probe.sendall(b"?")
                return probe.recv(1) == b"?"
        except OSError:
            return False

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)


if __name__ == "__main__":
    serve(sys.argv[1])
