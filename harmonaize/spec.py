"""The tenant interface's published spec, generated from the message types.

``docs/feed.asyncapi.yaml`` is this module's output (``python -m harmonaize.spec``
writes it; ``--check FILE`` fails if the file and the code have drifted apart). Each
message a tenant sends or receives is a frozen dataclass in :mod:`harmonaize.messages`
whose annotations carry the limits :func:`harmonaize.schema.from_plain` enforces; the
JSON Schema of a type is read off the same annotations, so the schema a client
generates from is the check the controller applies. The document is AsyncAPI 3.0 with
JSON Schema (draft 7, which AsyncAPI's schema format extends) for every payload, the
envelope of each transport, the error codes and the version policy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harmonaize import messages as m
from harmonaize.specschema import Builder, first_paragraph, reachable, ref

#: The spec's own version: the wire version, then a revision raised whenever a kind, a
#: field or a code is added (what a client written against an older revision ignores).
REVISION = 5
VERSION = f"{m.VERSION}.{REVISION}.0"

#: Kinds a tenant receives, and the requests it sends (with their answers).
RECEIVED = ("pool-capacity", "job-advisory", "job-health", "validation-notice",
            "job-progress", "application-xid", "negotiation-expired")
REQUESTS = {"subscribe": "subscribed", "job-declaration": "reply",
            "validation-answer": "reply", "negotiation-propose": "reply",
            "negotiation-counter": "reply", "negotiation-accept": "reply",
            "negotiation-reject": "reply", "negotiation-release": "reply",
            "negotiation-list": "reply", "maintenance-counter": "reply"}
#: The feed's default limits, as docs/tenant-guide.md states them.
LIMITS = {
    "max_frame_bytes": m.MAX_FRAME,
    "subscriptions_per_tenant": 256,
    "retention_per_topic": 1000,
    "renew_seconds": 30.0,
    "requests_per_second": 20.0,
    "request_burst": 100,
    "replayed_messages_per_second": 2000.0,
    "replay_burst": 10000,
    "replay_chunk_per_topic": 1000,
    "prefixes_per_request": 64,
    "positions_per_answer": 1024,
}
#: What a CloudEvent from the HTTP gateway carries beside the message.
CLOUDEVENT_TYPE_PREFIX = "io.harmonaize.feed."

POLICY = (
    f"Version policy. The wire version ({m.VERSION}) is the second element of every ZeroMQ "
    f"envelope and the `v{m.VERSION}` in every HTTP path; it changes only when an existing "
    "field changes meaning or goes away, and a controller then serves both versions for a "
    "deprecation period of at least six months. Within a wire version the revision (the "
    "middle number of this document's version) rises whenever a message kind, a field, an "
    "enum value or an error code is added. So a client must ignore fields and message kinds "
    "it does not know, treat an unknown enum value as 'other' and an unknown error code as "
    "a refusal, and never rely on the order of fields. Requests are checked strictly: a "
    "field the controller does not know is refused and named, never ignored.")




def _envelope() -> dict[str, Any]:
    return {
        "type": "array",
        "description": "A ZeroMQ frame: msgpack of [magic, version, kind, sender, seq, time, "
                       "body]. On the feed, seq is the topic's sequence number (a reply's "
                       "is 0); on a request, the client's own request number, which the "
                       "reply names. The message's category (condition, event, control) "
                       "is not in the frame: it is fixed per kind, the x-category of the "
                       "kind's message in this document.",
        "items": [
            {"const": m.MAGIC},
            {"const": m.VERSION},
            {"type": "string", "description": "the message kind"},
            {"type": "string", "maxLength": 128, "description": "'controller', or the "
             "client's name for itself"},
            {"type": "integer", "minimum": 0, "maximum": 2**62},
            {"type": "number", "minimum": 0, "description": "Unix time the frame was made"},
            {"type": "object", "description": "the message of that kind"},
        ],
        "minItems": 7,
        "additionalItems": False,
    }


def _cloudevent() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "A CloudEvents 1.0 event in the structured JSON format, as the HTTP "
                       "gateway sends each message in an SSE `data:` line.",
        "required": ["specversion", "id", "source", "type", "time", "data"],
        "properties": {
            "specversion": {"const": "1.0"},
            "id": {"type": "string", "description": "<epoch>:<topic>:<seq>, unique and "
                   "the same on every delivery of one publication"},
            "source": {"type": "string", "description": "the gateway's source (`[gateway] "
                       "source`)"},
            "type": {"type": "string", "description": f"{CLOUDEVENT_TYPE_PREFIX}<kind>.v"
                     f"{m.VERSION}, or {CLOUDEVENT_TYPE_PREFIX}subscribed.v{m.VERSION} and "
                     f"{CLOUDEVENT_TYPE_PREFIX}gap.v{m.VERSION} from the gateway itself"},
            "subject": {"type": "string", "description": "the topic (absent on the "
                        "gateway's own subscribed and gap events)"},
            "time": {"type": "string", "format": "date-time"},
            "datacontenttype": {"const": "application/json"},
            "dataschema": {"type": "string", "description": "this document's schema of "
                           "`data`, as a JSON pointer"},
            "seq": {"type": "integer", "description": "the topic's sequence number "
                    "(extension attribute)"},
            "category": {"enum": ["condition", "event", "control"],
                         "description": "extension attribute"},
            "data": {"type": "object", "description": "the message, as its schema says"},
        },
    }


def _gap() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Sent by the HTTP gateway on a resume when messages after the "
                       "cursor were no longer retained for some topics: those topics lost "
                       "messages for good (conditions are whole again with their next "
                       "message).",
        "required": ["topics"],
        "properties": {"topics": {"type": "array", "items": {"type": "string"},
                                  "maxItems": 1024}},
    }


def document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the tenant interface."""
    build = Builder()
    kinds = m.kinds()
    names = {kind: build.object(kinds[kind]) for kind in
             (*RECEIVED, *REQUESTS, *dict.fromkeys(REQUESTS.values()))}
    # Requests are checked strictly (an unknown field is refused and named), so their
    # schemas say so; what a tenant receives stays open to fields added later.
    received = reachable(build, [names[k] for k in (*RECEIVED, *REQUESTS.values())])
    for name in reachable(build, [names[k] for k in REQUESTS]) - received:
        build.schemas[name]["additionalProperties"] = False
    build.enum(m.ErrorCode)
    build.schemas["ErrorCode"]["x-meanings"] = {
        code.value: meaning for code, meaning in m.ERROR_MEANINGS.items()}
    build.schemas["Envelope"] = _envelope()
    build.schemas["CloudEvent"] = _cloudevent()
    build.schemas["Gap"] = _gap()
    build.schemas["HttpError"] = {
        "type": "object",
        "description": "The HTTP gateway's answer to a refused or failed request.",
        "required": ["error", "request_id"],
        "properties": {
            "error": {"type": "object", "required": ["code", "message"], "properties": {
                "code": ref("ErrorCode"),
                "message": {"type": "string"},
                "field": {"type": "string", "description": "the refused field's path, "
                          "where one field is at fault"},
                "refused": {"type": "array", "items": ref("Refusal")}}},
            "request_id": {"type": "string", "description": "the request's X-Request-Id, "
                           "or one the gateway made"}},
    }
    messages: dict[str, Any] = {}
    for kind, name in names.items():
        cls = kinds[kind]
        messages[kind] = {
            "name": kind,
            "title": name,
            "summary": first_paragraph(cls),
            "contentType": "application/msgpack",
            "payload": ref(name),
            "x-category": cls.CATEGORY.value,
        }
    messages["gap"] = {"name": "gap", "title": "Gap", "summary": _gap()["description"],
                       "contentType": "application/json", "payload": ref("Gap")}

    def refs(*kinds: str) -> dict[str, Any]:
        return {k: {"$ref": f"#/components/messages/{k}"} for k in kinds}

    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "HarmonAIze tenant feed",
            "version": VERSION,
            "description": (
                "What a GPU provider tells its tenants, and what tenants may ask of it. "
                "Pool topics carry capacity (noisy under differential privacy by default); "
                "job topics carry one tenant's own jobs. docs/wire.md says how frames, "
                "requests, gaps and resumes work on each transport; docs/tenant-guide.md "
                "what each field means for a tenant.\n\n" + POLICY),
            "x-limits": LIMITS,
        },
        "defaultContentType": "application/msgpack",
        "servers": {
            "zeromq": {
                "host": "controller.example:7401",
                "protocol": "zmq",
                "description": "ZeroMQ ROUTER socket with CurveZMQ: connect a DEALER with "
                               "your key pair and the controller's public key. Frames are "
                               "[topic, envelope] (the topic empty for replies); see "
                               "docs/wire.md.",
            },
            "http": {
                "host": "controller.example:7443",
                "protocol": "https",
                "pathname": f"/v{m.VERSION}",
                "description": "The HTTP gateway: GET /feed as server-sent events, each a "
                               "CloudEvent; POST /declarations, GET /notices, POST "
                               "/notices/{id}; bearer tokens or client certificates. See "
                               "docs/wire.md.",
            },
        },
        "channels": {
            "pool": {
                "address": "pool/{pool}/{gpuClass}",
                "description": "Capacity of one GPU class in one pool; open to every tenant.",
                "parameters": {"pool": {"description": "the pool"},
                               "gpuClass": {"description": "the GPU class"}},
                "messages": refs("pool-capacity"),
            },
            "job": {
                "address": "job/{tenant}/{job}/",
                "description": "One job's messages; only its own tenant may subscribe.",
                "parameters": {"tenant": {"description": "you"},
                               "job": {"description": "your job, as your scheduler named "
                                       "it"}},
                "messages": refs("job-advisory", "job-health", "validation-notice",
                                 "job-progress", "application-xid"),
            },
            "negotiation": {
                "address": "job/{tenant}/@negotiation/",
                "description": "Your negotiations' expiries (under job/{tenant}/, no job's "
                               "name: job names start with a letter or digit).",
                "parameters": {"tenant": {"description": "you"}},
                "messages": refs("negotiation-expired"),
            },
            "gateway": {
                "address": None,
                "description": "What the HTTP gateway adds to a stream of itself.",
                "messages": refs("gap"),
            },
            "requests": {
                "address": None,
                "description": "Requests to the controller (an empty topic on ZeroMQ).",
                "messages": refs(*REQUESTS),
            },
            "replies": {
                "address": None,
                "description": "The controller's answers, matched by the request's number.",
                "messages": refs(*dict.fromkeys(REQUESTS.values())),
            },
        },
        "operations": {
            "receivePoolCapacity": {"action": "receive", "channel": {"$ref": "#/channels/pool"},
                                    "summary": "capacity as it changes"},
            "receiveJobMessages": {"action": "receive", "channel": {"$ref": "#/channels/job"},
                                   "summary": "advice, health and notices for your jobs"},
            "receiveGaps": {"action": "receive", "channel": {"$ref": "#/channels/gateway"},
                            "summary": "HTTP only: topics that lost messages on a resume"},
            **{_operation(kind): {
                "action": "send",
                "channel": {"$ref": "#/channels/requests"},
                "messages": [{"$ref": f"#/channels/requests/messages/{kind}"}],
                "reply": {"channel": {"$ref": "#/channels/replies"},
                          "messages": [{"$ref": f"#/channels/replies/messages/{answer}"}]},
            } for kind, answer in REQUESTS.items()},
        },
        "components": {"schemas": dict(sorted(build.schemas.items())),
                       "messages": messages},
    }


def _operation(kind: str) -> str:
    first, *rest = kind.split("-")
    return "send" + first.capitalize() + "".join(p.capitalize() for p in rest)


def render() -> str:
    import yaml  # noqa: PLC0415 - only the generator needs it, not the daemons

    header = ("# Generated by `python -m harmonaize.spec` from harmonaize/messages/: edit "
              "the code, not this file.\n")
    return header + yaml.safe_dump(document(), sort_keys=False, allow_unicode=True,
                                   width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harmonaize.spec",
                                     description="write the tenant interface's AsyncAPI spec")
    parser.add_argument("--check", type=Path, metavar="FILE",
                        help="fail if FILE differs from what the code generates")
    args = parser.parse_args(argv)
    text = render()
    if args.check is not None:
        if args.check.read_text() != text:
            print(f"{args.check}: out of date: regenerate it with python -m harmonaize.spec "
                  f"> {args.check}", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
