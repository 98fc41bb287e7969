"""An AsyncAPI document as one static HTML page: what ``streamkit docs --serve`` shows.

Self-contained (inline CSS, no script, nothing fetched), so it opens offline
and can be committed or attached as is.  Every value from the document is
escaped.
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any

__all__ = ["render_html"]

_CSS = """
body{font:15px/1.5 system-ui,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#b71c1c;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:24px} header p{margin:4px 0 0;opacity:.9}
main{padding:8px 32px 40px;max-width:1100px}
section{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px 20px;margin:16px 0}
h2{font-size:19px;margin:8px 0} h3{font-size:16px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{text-align:left;border-bottom:1px solid #eee;padding:4px 8px;vertical-align:top}
th{color:#555;font-weight:600;width:22%}
code{background:#f1f1f1;padding:1px 4px;border-radius:3px}
.tag{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;color:#fff}
.receive{background:#2e7d32} .send{background:#1565c0}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
"""


def render_html(document: dict[str, Any]) -> str:
    """The page of ``document`` (an AsyncAPI 3.0 document as dicts)."""
    info = document.get("info", {})
    schemas = document.get("components", {}).get("schemas", {})
    messages = document.get("components", {}).get("messages", {})
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<link rel='icon' href='data:,'>",  # no favicon request
        f"<title>{_e(info.get('title', 'AsyncAPI'))}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_e(info.get('title', ''))} <small>{_e(info.get('version', ''))}</small>"
        f"</h1><p>AsyncAPI {_e(document.get('asyncapi', ''))} · "
        f"{_md(info.get('description', ''))}</p></header><main>",
    ]
    for name, server in document.get("servers", {}).items():
        parts.append(
            f"<section><h2>Server <code>{_e(name)}</code></h2>"
            + _table(
                [
                    ("host", server.get("host")),
                    ("protocol", server.get("protocol")),
                    ("coordinator", server.get("x-streamkit-coordinator")),
                ]
            )
            + "</section>"
        )
    operations = document.get("operations", {})
    for channel_id, channel in document.get("channels", {}).items():
        parts.append(_channel(channel_id, channel, operations, messages, schemas))
    if schemas:
        parts.append("<section><h2>Schemas</h2>")
        for name, schema in schemas.items():
            parts.append(f"<h3 id='schema-{_e(name)}'>{_e(name)}</h3>{_schema(schema, schemas)}")
        parts.append("</section>")
    parts.append(
        "<section><h2>The document</h2><details><summary>AsyncAPI JSON</summary><pre>"
        f"{_e(json.dumps(document, indent=2))}</pre></details></section></main></body></html>"
    )
    return "".join(parts)


def _channel(
    channel_id: str,
    channel: dict[str, Any],
    operations: dict[str, Any],
    messages: dict[str, Any],
    schemas: dict[str, Any],
) -> str:
    shards = channel.get("x-streamkit-shards")
    keys = channel.get("x-streamkit-partition-keys") or []
    html = [
        f"<section id='channel-{_e(channel_id)}'><h2>Stream <code>{_e(channel.get('title'))}"
        f"</code></h2><p>{_md(channel.get('description', ''))}</p>",
        _table(
            [
                ("address", channel.get("address")),
                ("shards", "coordinator's default" if shards is None else shards),
                ("shard keys", channel.get("x-streamkit-shard-key-pattern")),
                ("partition key", ", ".join(keys) if keys else "set by each publisher"),
                ("MAXLEN", channel.get("x-streamkit-maxlen") or "not trimmed"),
            ]
        ),
    ]
    ref = f"#/channels/{channel_id}"
    for operation_id, operation in operations.items():
        if operation.get("channel", {}).get("$ref") != ref:
            continue
        action = operation.get("action", "")
        rows = [
            (key.removeprefix("x-streamkit-"), value)
            for key, value in operation.items()
            if key.startswith("x-streamkit-")
        ]
        html.append(
            f"<h3><span class='tag {_e(action)}'>{_e(action)}</span> {_e(operation_id)}</h3>"
            f"<p>{_md(operation.get('summary', ''))}</p>{_table(rows)}"
        )
    for name in channel.get("messages", {}):
        message = messages.get(name, {})
        html.append(
            f"<h3>Message <code>{_e(name)}</code></h3><p>{_md(message.get('summary', ''))} "
            f"(<code>{_e(message.get('contentType', ''))}</code>)</p>"
            + _schema(message.get("payload", {}), schemas)
        )
    html.append("</section>")
    return "".join(html)


def _schema(schema: dict[str, Any], schemas: dict[str, Any]) -> str:
    """A schema's properties as a table (one level; references by name)."""
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[-1]
        target = schemas.get(name, {})
        return f"<p>Payload: <a href='#schema-{_e(name)}'>{_e(name)}</a></p>" + _properties(target)
    return _properties(schema)


def _properties(schema: dict[str, Any]) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return f"<pre>{_e(json.dumps(schema, indent=2))}</pre>"
    required = set(schema.get("required", []))
    rows = "".join(
        f"<tr><td><code>{_e(name)}</code></td><td>{_e(_type(prop))}</td>"
        f"<td>{'required' if name in required else 'optional'}</td>"
        f"<td>{_e(_constraints(prop))}</td></tr>"
        for name, prop in properties.items()
    )
    return f"<table><tr><th>field</th><th>type</th><th></th><th>constraints</th></tr>{rows}</table>"


def _type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in prop:
        return " | ".join(_type(p) for p in prop["anyOf"])
    if prop.get("type") == "array":
        return f"array of {_type(prop.get('items', {}))}"
    return str(prop.get("type", "any"))


def _constraints(prop: dict[str, Any]) -> str:
    skip = {"type", "title", "anyOf", "$ref", "items"}
    return ", ".join(f"{k}={v}" for k, v in prop.items() if k not in skip)


def _table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(key)}</th><td>{_e(_text(value))}</td></tr>" for key, value in rows)
    return f"<table>{body}</table>"


def _text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value)
    return "" if value is None else str(value)


def _md(value: Any) -> str:
    """Escaped text whose `backticks` become <code>: descriptions use them."""
    return re.sub(r"`([^`<]+)`", r"<code>\1</code>", _e(value))


def _e(value: Any) -> str:
    return escape(_text(value), quote=True)
