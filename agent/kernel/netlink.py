"""pyroute2 on a thread of its own.

pyroute2 0.9's synchronous API drives an asyncio loop of its own, which cannot
run inside the agent's running loop. Every netlink call therefore goes through
one dedicated thread; callers block for the (short) duration of the call.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from harmonaize.threads import set_os_thread_name

T = TypeVar("T")


class Netlink:
    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netlink",
                                          initializer=set_os_thread_name,
                                          initargs=("netlink",))
        self.ipr: Any = self.call(_open)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._thread.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        try:
            self.call(self.ipr.close)
        finally:
            self._thread.shutdown(wait=True)


def _open() -> Any:
    from pyroute2 import IPRoute  # noqa: PLC0415 - imported on the netlink thread

    return IPRoute()
