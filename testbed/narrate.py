"""How the demo tells its story: headings, indented output, what the tenant saw."""

from __future__ import annotations

from typing import Any


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def show_tenant(message: dict[str, Any]) -> None:
    body = message["body"]
    if message["kind"] == "pool-capacity":
        def b(v: dict[str, Any]) -> str:
            return f"{v['lo']}+" if v["hi"] is None else (
                str(v["lo"]) if v["lo"] == v["hi"] else f"{v['lo']}-{v['hi']}"
            )
        text = (f"capacity {body['pool']}/{body['gpu_class']}: hosts up {b(body['hosts_up'])}, "
                f"down {b(body['hosts_down'])}, GPUs {b(body['gpus_available'])}, "
                f"trend {body['trend']} (rev {body['revision']})")
    else:
        text = f"{message['kind']} {body}"
    print(f"   tenant | {message['topic']} #{message['seq']}: {text}", flush=True)


def capacity_is(up: int, down: int) -> Any:
    def check(message: dict[str, Any]) -> bool:
        if message.get("kind") != "pool-capacity":
            return False
        body = message["body"]
        return body["hosts_up"]["lo"] <= up <= (body["hosts_up"]["hi"] or up) and (
            body["hosts_down"]["lo"] <= down <= (body["hosts_down"]["hi"] or down)
        )

    return check


def indent(text: str) -> str:
    return "\n".join(f"   {line}" for line in text.rstrip().splitlines())
