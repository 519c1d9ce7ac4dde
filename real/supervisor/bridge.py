"""``python -m gyre.real.supervisor.bridge BASE_URL FOLDER``: the sandbox bridge as a supervised service.

The host side of the harnesses' sandbox bridge (``harness.sandbox.HostBridge``)
listening on ``FOLDER/proxy.sock`` until it is stopped (SIGTERM), so sandboxed
harnesses reach the proxy while the driver is down (``supervisor.services``).
Prints ``bridge listening on PATH`` once it listens.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from gyre.real.harness.sandbox import HostBridge


async def serve(base_url: str, folder: str) -> None:
    bridge = HostBridge(base_url, folder)
    await bridge.start()
    print(f"bridge listening on {bridge.path}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await bridge.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], sys.argv[2]))
