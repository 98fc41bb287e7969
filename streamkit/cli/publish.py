"""``streamkit publish STREAM GROUP KEY ...``: one message from the command line."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from streamkit.cli.common import fail, load_settings, run_async
from streamkit.cli.output import echo, echo_json

__all__ = ["publish"]


def publish(
    stream_prefix: Annotated[str, typer.Argument(help="The stream, e.g. 'orders'.")],
    group: Annotated[str, typer.Argument(help="A consumer group of it (routing is per group).")],
    key: Annotated[str, typer.Argument(help="The partition key: it decides the shard.")],
    fields: Annotated[
        list[str] | None, typer.Argument(help="Entry fields as FIELD=VALUE.", show_default=False)
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option(help="JSON for the 'payload' field (what typed handlers decode)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result as one JSON object.")
    ] = False,
) -> None:
    """Publish one message, routed by KEY like any publisher's.

    Uses the STREAMKIT_* settings (the credentials need the READ role).
    """
    entry: dict[str, str] = {}
    for item in fields or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            fail(f"fields are FIELD=VALUE, got {item!r}")
        entry[name] = value
    if payload is not None:
        try:
            json.loads(payload)
        except ValueError as exc:
            fail(f"--payload is not JSON: {exc}")
        entry["payload"] = payload
    if not entry:
        fail("nothing to publish: give FIELD=VALUE arguments or --payload JSON")
    settings = load_settings(quiet=True)

    async def work() -> dict[str, object]:
        from streamkit.publisher.publisher import Publisher

        async with Publisher(stream_prefix, group, settings=settings) as publisher:
            result = await publisher.publish(key, entry)
        return {
            "streamKey": result.stream_key,
            "shardIndex": result.shard_index,
            "recordId": result.record_id,
            "metadataVersion": result.metadata_version,
        }

    result = run_async(work)
    if as_json:
        echo_json(result)
    else:
        echo(f"published to {result['streamKey']} as {result['recordId']}")
