"""The engine's state as plain data (dicts, lists, strings, numbers) and back, so the
shell can store it, restore it after a restart and hand it to a new leader."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from controller.negotiation.capacity import Record
from controller.negotiation.engine import Answer, Engine, Negotiation, Policy
from controller.negotiation.maintenance import (
    Cause,
    Item,
    MaintenanceAnswer,
    MaintenanceBook,
    MaintenanceProposal,
    MaintenanceWindow,
    MState,
)
from controller.negotiation.types import (
    CapacityRelease,
    Closed,
    Counter,
    Flexibility,
    Hold,
    Offer,
    Proposal,
    Reason,
    Refusal,
    State,
)

#: Format of :func:`to_plain`'s output; a stored state of another version is refused.
VERSION = 1
ANSWERS: dict[str, type] = {t.__name__: t for t in (Offer, Counter, Refusal, Hold, Closed)}


def _plain(value: Any) -> Any:
    """A frozen dataclass as a dict of plain values (enums as their values)."""
    return None if value is None else {k: (v.value if hasattr(v, "value") else
                                           list(v) if isinstance(v, tuple) else v)
                                       for k, v in asdict(value).items()}


def _answer(value: Answer | None) -> Any:
    return None if value is None else {"kind": type(value).__name__, **_plain(value)}


def to_plain(engine: Engine) -> dict[str, Any]:
    return {
        "version": VERSION,
        "view": [_plain(c) for c in engine.view.values()],
        "negotiations": [{
            "proposal": _plain(n.proposal), "state": n.state.value, "round": n.round,
            "until": n.until, "offer": _answer(n.offer), "hold": _plain(n.hold),
            "answer": _answer(n.answer), "started_at": n.started_at,
        } for n in engine.negotiations.values()],
        "closed": [[t, r, until] for (t, r), until in engine.closed.items()],
        "records": {t: asdict(r) for t, r in engine.records.items()},
        "maintenance": [{
            "proposal": _plain(i.proposal), "state": i.state.value,
            "window": _plain(i.window), "until": i.until, "answer": _plain(i.answer),
        } for i in engine.maintenance.items.values()],
    }


def _build(kind: type, data: dict[str, Any]) -> Any:
    enums = {"flexibility": Flexibility, "reason": Reason, "state": State}
    args = {f.name: data[f.name] for f in fields(kind) if f.name in data}
    for name, enum in enums.items():
        if name in args and kind is not MaintenanceWindow:
            args[name] = enum(args[name])
    return kind(**args)


def _load_answer(data: dict[str, Any] | None) -> Any:
    if data is None:
        return None
    return _build(ANSWERS[data["kind"]], data)


def from_plain(policy: Policy, data: dict[str, Any]) -> Engine:
    """The engine :func:`to_plain` saw; a ValueError names what does not fit."""
    if data.get("version") != VERSION:
        raise ValueError(f"negotiation state version {data.get('version')!r}, "
                         f"expected {VERSION}")
    engine = Engine(policy)
    for c in data["view"]:
        release = _build(CapacityRelease, c)
        engine.view[(release.pool, release.gpu_class)] = release
    for n in data["negotiations"]:
        proposal = _build(Proposal, n["proposal"])
        engine.negotiations[(proposal.tenant, proposal.request_id)] = Negotiation(
            proposal, State(n["state"]), n["round"], n["until"], _load_answer(n["offer"]),
            None if n["hold"] is None else _build(Hold, n["hold"]),
            _load_answer(n["answer"]), n["started_at"])
    engine.closed = {(t, r): until for t, r, until in data["closed"]}
    engine.records = {t: Record(**r) for t, r in data["records"].items()}
    book = MaintenanceBook(urgency=dict(policy.urgency))
    for i in data["maintenance"]:
        p = dict(i["proposal"], cause=Cause(i["proposal"]["cause"]))
        w = dict(i["window"], state=MState(i["window"]["state"]))
        a = i["answer"]
        book.items[p["notice_id"]] = Item(
            MaintenanceProposal(**p), MState(i["state"]), MaintenanceWindow(**w), i["until"],
            None if a is None else MaintenanceAnswer(a["tenant"], a["notice_id"],
                                                     tuple(a["windows"])))
    engine.maintenance = book
    return engine
