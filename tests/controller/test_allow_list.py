"""The key allow-list reads its directory again while the directory's mtime is recent: a
key file created and then written (or a second key filed) within one tick of the file
system's clock leaves the mtime where it was, and must not be missed for good."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zmq

from controller import auth
from harmonaize import keys

pytestmark = [pytest.mark.hardening, pytest.mark.controller]


def test_a_key_written_after_its_file_was_created_is_read_in_the_same_tick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "tenants"
    directory.mkdir()
    alpha = keys.write_public(directory, "alpha", zmq.curve_keypair()[0])
    beta = directory / f"beta{keys.PUBLIC_SUFFIX}"
    beta.touch()  # created: a reader between this and the write sees an empty file
    stamp = os.stat(directory).st_mtime_ns
    clock = [stamp + 500_000_000]  # half a second after the last change
    monkeypatch.setattr(auth.time, "time_ns", lambda: clock[0])
    allow = auth.AllowList(directory)
    assert allow.names() == ["alpha"]
    public = zmq.curve_keypair()[0]
    beta.write_text(f'public-key = "{public.decode()}"\n')
    os.utime(directory, ns=(stamp, stamp))  # the same tick: the mtime did not move
    assert allow.names() == ["alpha", "beta"]
    assert allow.lookup(public) == "beta"
    # Still for a second: the stamp is trusted, and an unchanged directory is not read.
    clock[0] = stamp + auth.SETTLED_NS
    assert allow.names() == ["alpha", "beta"]
    alpha.unlink()
    os.utime(directory, ns=(stamp, stamp))
    assert allow.names() == ["alpha", "beta"], "a settled stamp is trusted"
