"""Compile and load BPF programs in a short-lived child process.

bcc compiles C with an in-process LLVM that costs the process holding it
about 120 MB of resident memory for good. So the agent forks a loader:
``python -m agent.kernel.bpfload`` compiles with bcc, loads the programs,
attaches the tracepoints, and hands every program, map and tracepoint file
descriptor back over a Unix socket (SCM_RIGHTS), with the sizes of each map.
Then it exits without tearing anything down (os._exit): the kernel objects
live on in the agent, which holds the descriptors. Closing them detaches the
tracepoints and frees the maps.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from agent.kernel.bpfsys import BpfMap, open_map

MAX_FDS = 64
LOAD_TIMEOUT = 120.0


class LoadError(Exception):
    """The loader failed; the message is its one-line reason."""


@dataclass(frozen=True)
class Request:
    """One C source to compile: programs to load and tracepoints to attach."""

    source: str
    cflags: list[str] = field(default_factory=list)
    #: Program name -> "sched_cls" (tc) or "tracepoint".
    programs: dict[str, str] = field(default_factory=dict)
    #: "category:event" -> program name.
    tracepoints: dict[str, str] = field(default_factory=dict)
    #: C appended to the source before compiling (programs generated for this load).
    extra: str = ""


@dataclass
class Loaded:
    programs: dict[str, int]
    maps: dict[str, BpfMap]
    #: Perf event descriptors that keep the tracepoints attached.
    attachments: list[int]

    def close(self) -> None:
        for fd in [*self.programs.values(), *self.attachments]:
            with contextlib.suppress(OSError):
                os.close(fd)
        for bpf_map in self.maps.values():
            bpf_map.close()
        self.programs, self.attachments, self.maps = {}, [], {}


def load(requests: list[Request]) -> Loaded:
    """Run the loader; return what it loaded, or raise LoadError with its reason."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # bcc's compile errors can be long: a file, so the child never blocks on a full pipe.
    with parent, tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agent.kernel.bpfload", str(child.fileno())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                pass_fds=(child.fileno(),),
            )
        finally:
            child.close()
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(json.dumps([r.__dict__ for r in requests]).encode())
        parent.settimeout(LOAD_TIMEOUT)
        try:
            message, fds, _, _ = socket.recv_fds(parent, 1 << 20, MAX_FDS)
        except TimeoutError:
            proc.kill()
            raise LoadError(f"the BPF loader did not answer in {LOAD_TIMEOUT:g} s") from None
        finally:
            proc.wait(timeout=LOAD_TIMEOUT)
        errors.seek(0)
        stderr = errors.read().decode(errors="replace")
    try:
        reply = json.loads(message or b"{}")
    except ValueError:
        reply = {}
    if "error" in reply or not message:
        for fd in fds:
            os.close(fd)
        reason = reply.get("error") or _last_line(stderr) or "the BPF loader failed"
        raise LoadError(reason)
    return Loaded(
        programs={name: fds[i] for name, i in reply["programs"].items()},
        maps={name: open_map(name, fds[i]) for name, i in reply["maps"].items()},
        attachments=[fds[i] for i in reply["attachments"]],
    )


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# --- the child ------------------------------------------------------------------------

def _child(channel: socket.socket) -> None:
    import ctypes  # noqa: PLC0415

    from bcc import BPF, lib  # noqa: PLC0415 - only the loader ever imports bcc

    # bcc's own binding leaves these undeclared (bcc_common.h has them).
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.bpf_table_name.restype = ctypes.c_char_p

    requests = [Request(**r) for r in json.loads(sys.stdin.buffer.read())]
    fds: list[int] = []
    reply: dict[str, Any] = {"programs": {}, "maps": {}, "attachments": []}
    keep = []  # the BPF objects must outlive the send
    for request in requests:
        try:
            if request.extra:
                with open(request.source, encoding="utf-8") as source:
                    text = source.read() + "\n" + request.extra
                bpf = BPF(text=text.encode(), cflags=list(request.cflags))
            else:
                bpf = BPF(src_file=request.source.encode(), cflags=list(request.cflags))
        except Exception as exc:
            raise LoadError(f"bcc could not compile {os.path.basename(request.source)}: "
                            f"{exc}") from None
        keep.append(bpf)
        for name, kind in request.programs.items():
            prog_type = BPF.SCHED_CLS if kind == "sched_cls" else BPF.TRACEPOINT
            fn = bpf.load_func(name.encode(), prog_type)
            reply["programs"][name] = len(fds)
            fds.append(fn.fd)
        for tracepoint, name in request.tracepoints.items():
            bpf.attach_tracepoint(tp=tracepoint.encode(), fn_name=name.encode())
            reply["attachments"].append(len(fds))
            fds.append(bpf.tracepoint_fds[tracepoint.encode()])
        for index in range(lib.bpf_num_tables(bpf.module)):
            raw_name = lib.bpf_table_name(bpf.module, index)
            reply["maps"][raw_name.decode()] = len(fds)
            fds.append(bpf[raw_name].map_fd)
    socket.send_fds(channel, [json.dumps(reply).encode()], fds)


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    try:
        _child(channel)
    except Exception as exc:
        with contextlib.suppress(OSError):
            socket.send_fds(channel, [json.dumps({"error": str(exc) or repr(exc)}).encode()],
                            [])
        channel.close()
        os._exit(1)
    channel.close()
    # No interpreter shutdown: bcc would detach the tracepoints the agent now holds.
    os._exit(0)


if __name__ == "__main__":
    main()
