"""The kernel log's record format and the driver's XID line, field by field."""

from __future__ import annotations

import pytest

from agent.kernel.kmsgformat import KmsgRecord, kmsg_line, parse_record, parse_xid, pci_key

pytestmark = pytest.mark.jobhealth


@pytest.mark.parametrize(("text", "key"), [
    ("00000000:3B:00.0", (0, 0x3B, 0)), ("0000:3b:00", (0, 0x3B, 0)),
    (" 0001:af:1f.7 ", (1, 0xAF, 0x1F)), ("3b:00", None), ("0:1:2:3", None),
    ("zz:3b:00", None), ("0000:3b:zz", None), ("", None)])
def test_pci_addresses_from_nvml_and_the_driver_compare_alike(text: str,
                                                              key: tuple | None) -> None:
    assert pci_key(text) == key


@pytest.mark.parametrize(("line", "record"), [
    ("6,42,1234,-;hello", KmsgRecord(0, 6, 42, 1234, "hello")),
    ("14,1,0,c;a;b", KmsgRecord(1, 6, 1, 0, "a;b")),
    ("3,7,9,-,caller=T12;msg", KmsgRecord(0, 3, 7, 9, "msg")),
    ("65535,1,1,-;x", KmsgRecord(8191, 7, 1, 1, "x")),
    ("65536,1,1,-;x", None), ("6,42,1234,-", None), ("6,42;x", None), ("a,1,1,-;x", None),
    (";x", None)])
def test_record_headers(line: str, record: KmsgRecord | None) -> None:
    assert parse_record(line) == record


def test_xid_lines_field_by_field() -> None:
    assert parse_xid("NVRM: Xid (PCI:0001:AB:1c.0): 119, pid=77, name=pt_main, Ch 1") == (
        (1, 0xAB, 0x1C), 119, 77, "pt_main")
    assert parse_xid("NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, x") == (
        (0, 0x3B, 0), 13, None, None)
    assert parse_xid("NVRM: Xid (PCI:0000:3b:00): 13") is None  # cut after the number
    assert parse_xid("NVRM: Xid (PCI:0000:3b): 13, x") is None
    assert parse_xid("kernel: something else") is None


def test_a_fake_record_is_written_as_the_kernel_writes_one() -> None:
    assert kmsg_line(7, "m", facility=1, usec=99) == "11,7,99,-;m\n"
    assert kmsg_line(8, "n") == "3,8,0,-;n\n"
    assert parse_record(kmsg_line(9, "o", level=6).rstrip("\n")) == KmsgRecord(0, 6, 9, 0, "o")
