"""``gyre proxy --config FILE``: run the black-box proxy in the foreground.

``register(subparsers)`` adds the sub-command (heavy imports happen inside
``run``). ``--host``/``--port`` override the file; ``--port 0`` picks a free
port. The chosen address is printed as one JSON line
``{"event": "listening", "url": ...}`` so a supervisor (or a test) can read it.
``--loop`` picks the event loop: uvloop (installed with the ``real`` extra; about a fifth less
CPU per call than asyncio's own, ``bench/bench_proxy.py``) unless asked otherwise; ``GET /``
names the loop that runs. ``--gc`` sets up the garbage collector (``proxy.collector``: tuned for
a long-lived server unless ``default`` is asked for); ``GET /`` reports its collections.
A start-up fault (invalid config, damaged ``keys.json``, records folder that
cannot be created or written, a disk too small for the commit journal, a
records folder already in use) is one line on stderr naming the file, exit
status 2. The process stops cleanly on SIGINT/SIGTERM: aiohttp closes the listeners, and
the record logs are closed; every record whose response completed is on disk. The stop is
bounded: calls still in flight get ``STOP_GRACE_S`` to finish, then are cut (never completed,
never recorded), so a call held waiting for an engine cannot keep the proxy alive after its job
(the job's parent-death signal is this SIGTERM: ``runtime.proxy_process``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

STOP_GRACE_S = 5.0  # calls in flight at SIGTERM get this long (``ProxyProcess.stop`` SIGKILLs after 15 s)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("proxy", help="run the black-box model proxy (Anthropic/OpenAI APIs, TITO records)")
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="proxy configuration (.json or .toml)")
    parser.add_argument("--host", default=None, help="override the configured host")
    parser.add_argument("--port", type=int, default=None, help="override the configured port (0: any free port)")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="event loop: uvloop (libuv, less CPU per call) or asyncio's own; auto: uvloop "
                             "when installed")
    parser.add_argument("--gc", choices=("tuned", "default"), default="tuned",
                        help="garbage collector: tuned (startup objects frozen, young collected every 50k "
                             "objects; 7-22%% less CPU under load) or CPython's default")


def run(args: argparse.Namespace, disk: Any = None) -> int:
    """Serve until SIGINT/SIGTERM; ``disk``: the record store's writes and syncs (``store.durable.Disk``;
    the system calls when None)."""
    import logging

    from gyre.real.proxy.config import ProxyConfigError, load_proxy_config

    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_proxy_config(args.config)
    except ProxyConfigError as exc:  # a missing, unreadable or invalid file: named, no traceback
        print(f"gyre proxy: error: {exc}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        config = config.with_overrides(**overrides)
    from gyre.real.store.commit_journal import JournalBusy

    try:
        _runner(args.loop)(_serve(config, args.gc, disk))
    except KeyboardInterrupt:
        pass
    except (JournalBusy, ProxyConfigError, OSError) as exc:
        # another proxy on this records folder, a damaged key file, a folder that cannot be written, a disk
        # too small for the journal: one line naming the file, no traceback
        print(f"gyre proxy: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _runner(loop: str):
    """``asyncio.run`` or ``uvloop.run`` for ``--loop`` (``auto``: uvloop when it is installed)."""
    import asyncio

    if loop == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        if loop == "uvloop":
            raise SystemExit("gyre proxy --loop uvloop: uvloop is not installed (pip install 'gyre[real]')") from None
        return asyncio.run
    return uvloop.run


async def _serve(config, gc_mode: str = "tuned", disk: Any = None) -> None:
    import asyncio
    import signal

    from aiohttp import web

    from gyre.real.proxy import collector
    from gyre.real.proxy.app import RUNNER_ARGS, ProxyServer, keep_half_open
    from gyre.real.store.durable import SYSTEM_DISK

    server = ProxyServer(config, disk=disk if disk is not None else SYSTEM_DISK)
    collector.tune(gc_mode)  # after everything startup builds, before the first request
    runner = web.AppRunner(server.application(), access_log=None, handle_signals=False,
                            shutdown_timeout=STOP_GRACE_S, **RUNNER_ARGS)
    await runner.setup()
    keep_half_open(runner)
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # the real port when 0 was asked for
    print(json.dumps({"event": "listening", "url": f"http://{config.host}:{port}"}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None, *, disk: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="gyre proxy")
    add_arguments(parser)
    return run(parser.parse_args(argv), disk)


if __name__ == "__main__":
    sys.exit(main())
