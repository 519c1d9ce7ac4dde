"""Loopback-only network sandbox for one harness process, bridged to the proxy.

An isolated harness runs as
``unshare -n python -m gyre.real.harness.sandbox --unix SOCK --port P -- ARGV...``:
a fresh network namespace whose only interface is ``lo``. Inside it, this
module brings ``lo`` up, listens on 127.0.0.1:P (P is the proxy's own port, so
the harness's base URL stays the same) and carries every connection over the
Unix socket SOCK to the runner's ``HostBridge``, which carries it on to the
proxy's TCP address. A Unix socket at a path crosses network namespaces; TCP
does not.

Invariants:
- the harness reaches one TCP address outside its namespace, the proxy's, and
  only through the bridge; nothing on the host network reaches in;
- bytes pass unchanged in both directions, half-closes included;
- the listener is up before the harness starts, so no first call races it;
- the sandbox process is the harness's parent in the same process group, so the
  runner's killpg ends both; TERM and INT are passed on, and the sandbox ends
  the way the harness did (its exit status, or death by the same signal);
- ``netns_problem()`` probes once per process; where no namespace can be made
  the reason is a sentence, and demanded isolation raises with it; a caller
  may pass its own ``Namespaces`` (what the host can make) instead of the probe;
- with a mount namespace, every existing path in ``hide`` is covered before
  the harness starts, or the sandbox exits with ``SANDBOX_FAILED`` naming it.

Private mount namespace: paths named in ``hide`` (``sandbox_argv``; by
default the ``GYRE_SANDBOX_HIDE`` environment variable, ``os.pathsep``-separated:
the proxy's record store, which holds ``keys.json``) are covered inside the
namespace (``unshare -m``, private propagation) before the harness starts: a
directory by an empty read-only tmpfs, a file by ``/dev/null``. The harness
still sees its workspace, its home and the bridge's socket; a hidden path that
contains any of them (or the working directory) is refused. The host's mounts
are untouched. Fallback: where no mount namespace can be made
(``mountns_problem()`` says why), the harness runs with the network namespace
only and the paths stay visible; a warning names the reason once per process.

Not isolated: the rest of the filesystem, hence Unix sockets at paths (the
bridge's own leads only to the proxy).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import functools
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

ISOLATE_MODES = ("auto", "always", "never")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
CHUNK = 1 << 16
SANDBOX_FAILED = 125  # exit status when the sandbox could not set itself up
COULD_NOT_START = 127  # exit status when the harness binary could not be started
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
HIDE_ENV = "GYRE_SANDBOX_HIDE"
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000
_PROBE_MOUNT = ("import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
                "sys.exit(0 if libc.mount(b'tmpfs', sys.argv[1].encode(), b'tmpfs', 0, b'size=4k') == 0 "
                "else ctypes.get_errno() or 1)")


class SandboxUnavailable(RuntimeError):
    """Isolation was demanded where it cannot be had; the message says why."""


@functools.cache
def _netns_probe() -> tuple[tuple[str, ...], str | None]:
    """(``unshare`` prefix, None) when a network namespace can be made, else ((), reason)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return (), "no unshare binary on PATH"
    root = os.geteuid() == 0
    prefix = (unshare, "-n") if root else (unshare, "-r", "-n")  # non-root: map to root in a user namespace
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"`{' '.join(prefix)} true` could not run: {exc}"
    if probe.returncode != 0:
        who = "root" if root else "this user (unprivileged user namespaces may be disabled)"
        why = probe.stderr.decode(errors="replace").strip() or f"exit status {probe.returncode}"
        return (), f"`{' '.join(prefix)} true` failed for {who}: {why}"
    return prefix, None


@functools.cache
def _mountns_probe() -> tuple[tuple[str, ...], str | None]:
    """(``unshare`` prefix with ``-m``, None) when a private mount namespace can cover a path, else ((), reason)."""
    prefix, problem = _netns_probe()
    if problem is not None:
        return (), problem
    prefix = (*prefix, "-m")
    with tempfile.TemporaryDirectory(prefix="gyre-mntprobe-") as target:
        try:
            probe = subprocess.run([*prefix, sys.executable, "-c", _PROBE_MOUNT, target], capture_output=True,
                                   timeout=20)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return (), f"`{' '.join(prefix)}` could not run: {exc}"
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip() or f"mount(2) failed with errno {probe.returncode}"
        return (), f"no private mount namespace with a tmpfs mount (`{' '.join(prefix)}`): {why}"
    return prefix, None


class Namespaces:
    """The namespaces this host can make for a harness: each method returns (``unshare`` prefix, None),
    or ((), the reason in words) where it cannot be made. This one probes the host once per process;
    ``HarnessRunner``, ``choose_isolation`` and ``sandbox_argv`` take another where the host's answer
    should not decide (a test of the fallback, a caller that already knows)."""

    def network(self) -> tuple[tuple[str, ...], str | None]:
        return _netns_probe()

    def mount(self) -> tuple[tuple[str, ...], str | None]:
        """The prefix with ``-m`` (a private mount namespace inside the network one)."""
        return _mountns_probe()


HOST_NAMESPACES = Namespaces()


def mountns_problem() -> str | None:
    """None when harnesses can get a private mount namespace here, else the reason in words (cached)."""
    return _mountns_probe()[1]


def hidden_paths(hide: list[str | os.PathLike] | None = None) -> list[Path]:
    """The absolute paths to hide: ``hide``, or those in ``$GYRE_SANDBOX_HIDE``."""
    if hide is None:
        hide = [p for p in os.environ.get(HIDE_ENV, "").split(os.pathsep) if p]
    return [Path(os.path.abspath(p)) for p in hide]


@functools.cache
def _warn_unhidden(problem: str) -> None:
    log.warning("harness sandbox: paths that should be hidden stay visible to harnesses: %s", problem)


def netns_problem() -> str | None:
    """None when this process can make a network namespace, else the reason in words (cached)."""
    return _netns_probe()[1]


def isolation_problem(base_url: str, namespaces: Namespaces = HOST_NAMESPACES) -> str | None:
    """None when harnesses for ``base_url`` can be sandboxed here, else the reason."""
    host = urlsplit(base_url).hostname
    if host not in LOOPBACK_HOSTS:
        return f"the proxy's host {host!r} in {base_url} is not one of {LOOPBACK_HOSTS}"
    return namespaces.network()[1]


def choose_isolation(mode: str, base_url: str, namespaces: Namespaces = HOST_NAMESPACES) -> bool:
    """Whether to sandbox harnesses: ``mode`` is "auto", "always" (raise where impossible) or "never"."""
    if mode not in ISOLATE_MODES:
        raise ValueError(f"isolate must be one of {ISOLATE_MODES}, not {mode!r}")
    if mode == "never":
        return False
    problem = isolation_problem(base_url, namespaces)
    if mode == "always" and problem is not None:
        raise SandboxUnavailable(f"isolate='always' but harnesses cannot be sandboxed here: {problem}")
    return problem is None


def require_executable(name: str, cwd: Path, path: str) -> None:
    """Raise FileNotFoundError unless ``name`` can be started from ``cwd`` with ``path``.

    Checked before sandboxing so a missing harness stays a start failure, not a failed child.
    """
    found = shutil.which(os.path.join(cwd, name)) if os.sep in name else shutil.which(name, path=path)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "no such executable", name)


def proxy_address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


def sandbox_argv(argv: list[str], unix_path: Path, port: int, hide: list[str | os.PathLike] | None = None,
                 namespaces: Namespaces = HOST_NAMESPACES) -> list[str]:
    """``argv`` wrapped to run in a fresh loopback-only namespace bridged to ``unix_path``, with
    ``hide`` (default: ``$GYRE_SANDBOX_HIDE``) covered in a private mount namespace where one can be made."""
    prefix, problem = namespaces.network()
    if problem is not None:
        raise SandboxUnavailable(f"cannot isolate the harness: {problem}")
    paths = hidden_paths(hide)
    hiding: list[str] = []
    if paths:
        mount_prefix, mount_problem = namespaces.mount()
        if mount_problem is None:
            prefix = mount_prefix
            for path in paths:
                hiding += ["--hide", str(path)]
        else:
            _warn_unhidden(mount_problem)
    return [*prefix, sys.executable, "-m", "gyre.real.harness.sandbox", "--unix", str(unix_path),
            "--port", str(port), *hiding, "--", *argv]


# --- host side: Unix socket -> proxy TCP address, on the runner's event loop ---------------------

class HostBridge:
    """Listens on a Unix socket and pipes each connection to the proxy's TCP address."""

    def __init__(self, base_url: str, folder: str | os.PathLike | None = None) -> None:
        """``folder``: where its socket goes (a supervised bridge's fixed place); default a fresh temporary one."""
        self.host, self.port = proxy_address(base_url)
        self.folder = folder
        self.path: Path | None = None
        self._server = None
        self._open: set = set()
        self._remove = None

    async def start(self) -> None:
        import asyncio  # here only: the namespace side imports this module and must start fast

        folder = self.folder or tempfile.mkdtemp(prefix="gyre-bridge-")  # short: a socket path must fit 108 bytes
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self._remove = weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)  # at close() or exit
        self.path = Path(folder) / "proxy.sock"
        self.path.unlink(missing_ok=True)  # a bridge before this one that was killed left its socket
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        except OSError as exc:
            raise SandboxUnavailable(f"the sandbox bridge could not listen on unix socket {self.path}: {exc}") from exc

    async def _serve(self, reader, writer) -> None:
        import asyncio

        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            log.warning("sandbox bridge: cannot connect to the proxy at %s:%d: %s", self.host, self.port, exc)
            writer.close()
            return
        self._open |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
                self._open.discard(w)

    async def close(self) -> None:
        """Stop listening, drop open connections and remove the socket."""
        if self._server is not None:
            self._server.close()
            for w in list(self._open):
                w.transport.abort()
            await self._server.wait_closed()
            self._server = None
        if self._remove is not None:
            self._remove()


async def _pipe(reader, writer) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if not writer.is_closing():
            writer.write_eof()
    except OSError:
        writer.transport.abort()


# --- namespace side: 127.0.0.1:P -> Unix socket, then the harness as a child ----------------------

def bring_loopback_up() -> None:
    """``ip link set lo up`` where ``ip`` exists, else the same through SIOCSIFFLAGS."""
    ip = shutil.which("ip")
    if ip is not None and subprocess.run([ip, "link", "set", "lo", "up"], capture_output=True).returncode == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _libc_mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), str(target).encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount over {target}: {os.strerror(error)}")


def hide_paths(paths: list[Path], keep: list[Path]) -> list[Path]:
    """Cover each existing path of ``paths`` (in this mount namespace): a directory by an empty
    read-only tmpfs, anything else by ``/dev/null``. Returns the covered paths; raises ValueError
    when a path contains one of ``keep`` (it would hide what the harness needs)."""
    covered = []
    for path in paths:
        for kept in keep:
            if kept == path or path in kept.parents:
                raise ValueError(f"cannot hide {path}: it holds {kept}, which the harness needs")
        if not os.path.lexists(path):
            continue
        if path.is_dir():
            _libc_mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
            _libc_mount("tmpfs", path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        else:
            _libc_mount("/dev/null", path, None, MS_BIND, None)
        covered.append(path)
    return covered


def _accept_forever(listener: socket.socket, unix_path: str) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_forward, args=(conn, unix_path), daemon=True).start()


def _forward(conn: socket.socket, unix_path: str) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(unix_path)
    except OSError as exc:
        print(f"harness.sandbox: cannot reach the host bridge at unix socket {unix_path}: {exc}",
              file=sys.stderr, flush=True)
        conn.close()
        up.close()
        return
    back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
    back.start()
    _pump(conn, up)
    back.join()
    conn.close()
    up.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _run_child(argv: list[str]) -> int:
    """Start ``argv``, pass TERM/INT on to it, and return its wait status (negative: killed)."""
    child: subprocess.Popen | None = None
    early: list[int] = []

    def pass_on(sig: int, _frame) -> None:
        if child is None:
            early.append(sig)
        else:
            child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, pass_on)
    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        print(f"could not start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        return COULD_NOT_START
    for sig in early:
        child.send_signal(sig)
    return child.wait()


def _end_like(status: int) -> None:
    """Exit with the child's status, or die by the signal that killed it (as an unsandboxed run would)."""
    if status >= 0:
        sys.exit(status)
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
    sys.exit(128 - status)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run ARGV in this loopback-only namespace, bridged to the proxy")
    parser.add_argument("--unix", required=True, help="host bridge's Unix socket")
    parser.add_argument("--port", type=int, required=True, help="proxy port to serve on 127.0.0.1 here")
    parser.add_argument("--hide", action="append", default=[], help="path to cover (needs a mount namespace)")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("no harness command after --")
    if args.hide:
        keep = [Path(args.unix).resolve(), Path.cwd().resolve(), Path.home().resolve()]
        try:
            hide_paths([Path(p).resolve() for p in args.hide], keep)
        except (OSError, ValueError) as exc:
            print(f"harness.sandbox: could not hide a path from the harness: {exc}", file=sys.stderr, flush=True)
            sys.exit(SANDBOX_FAILED)
    try:
        bring_loopback_up()
    except OSError as exc:
        print(f"runtime_sandbox: could not bring lo up in the namespace: {exc}", file=sys.stderr, flush=True)
        sys.exit(SANDBOX_FAILED)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", args.port))
        listener.listen(128)
    except OSError as exc:
        print(f"harness.sandbox: cannot listen on 127.0.0.1:{args.port} in the namespace: {exc}",
              file=sys.stderr, flush=True)
        sys.exit(SANDBOX_FAILED)
    threading.Thread(target=_accept_forever, args=(listener, args.unix), daemon=True).start()
    _end_like(_run_child(command))


if __name__ == "__main__":
    main()
