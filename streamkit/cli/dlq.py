"""``streamkit dlq list|replay``: a consumer group's dead-letter stream."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated

import typer

from streamkit.cli.common import EXIT_FAILED, fail, load_settings, run_async
from streamkit.cli.output import echo, echo_json

if TYPE_CHECKING:
    from streamkit.connections import AsyncRedis
    from streamkit.consumer.dead_letter import ReplayOutcome
    from streamkit.settings import StreamKitSettings

__all__ = ["dlq"]

dlq = typer.Typer(
    name="dlq",
    help="List and replay a consumer group's dead-letter stream.",
    no_args_is_help=True,
)

_PrefixArg = Annotated[str, typer.Argument(help="The stream prefix, e.g. 'orders'.")]
_GroupArg = Annotated[str, typer.Argument(help="The consumer group whose dead letters these are.")]
_StreamOpt = Annotated[
    str | None,
    typer.Option("--stream", help="The dead-letter stream key (default: PREFIX/dlq/GROUP)."),
]
_CountOpt = Annotated[int, typer.Option(min=1, help="At most this many, oldest first.")]
_IdsOpt = Annotated[
    list[str] | None, typer.Option("--id", help="Only this dead letter (repeatable).")
]


@dlq.command("list")
def dlq_list(
    stream_prefix: _PrefixArg,
    group: _GroupArg,
    stream: _StreamOpt = None,
    count: _CountOpt = 100,
    ids: _IdsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show dead letters: where they came from, attempts, error, fields."""

    from streamkit.consumer.dead_letter import read_dead_letters
    from streamkit.consumer.failure import dead_letter_key

    settings = load_settings(quiet=True)
    key = stream or dead_letter_key(stream_prefix, group)

    async def work() -> None:
        async with _redis(settings) as redis:
            letters = await read_dead_letters(redis, key, count=count, ids=ids or ())
        for letter in letters:
            data = letter.as_json()
            if as_json:
                echo_json(data)
            else:
                echo(
                    f"{data['id']}  {data['originalStream']}/{data['originalId']}  "
                    f"attempts={data['attempts']}  {data['error']}"
                )
        if not letters and not as_json:
            echo(f"no dead letters in {key}", err=True)

    run_async(work)


@dlq.command("replay")
def dlq_replay(
    stream_prefix: _PrefixArg,
    group: _GroupArg,
    stream: _StreamOpt = None,
    count: _CountOpt = 100,
    ids: _IdsOpt = None,
    key_field: Annotated[
        str | None,
        typer.Option(help="Entry field holding the publisher's partition key: route by it."),
    ] = None,
    payload_key: Annotated[
        str | None,
        typer.Option(help="Key of the JSON 'payload' field holding the publisher's partition key."),
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the dead letters after replaying.")] = False,
) -> None:
    """Publish dead letters again (original fields only), then delete them.

    With --key-field or --payload-key the partition key is routed with the
    current routing (through the coordinator); name the value the publisher
    passed to publish() as the key, or entries land beside the wrong keys.
    Without, each goes back to its original shard stream.  Every group
    reading the stream sees the replay.
    """
    from streamkit.consumer.dead_letter import read_dead_letters, replay
    from streamkit.consumer.failure import dead_letter_key

    if key_field and payload_key:
        fail("give --key-field or --payload-key, not both")
    settings = load_settings(quiet=True)
    key = stream or dead_letter_key(stream_prefix, group)

    async def work() -> list[ReplayOutcome]:
        async with _redis(settings) as redis:
            letters = await read_dead_letters(redis, key, count=count, ids=ids or ())
            if not (key_field or payload_key):
                return await replay(redis, key, letters, delete=not keep)
            from streamkit.publisher.publisher import Publisher

            async with Publisher(stream_prefix, group, settings=settings, redis=redis) as publisher:
                return await replay(
                    redis,
                    key,
                    letters,
                    publish=publisher.publish,
                    key_field=key_field,
                    payload_key=payload_key,
                    delete=not keep,
                )

    outcomes = run_async(work)
    # Silence would read as success: say what there was nothing of.
    missing = [i for i in ids or () if i not in {o.letter.id for o in outcomes}]
    for letter_id in missing:
        echo(f"{letter_id}  not replayed: no such dead letter in {key}", err=True)
    if not outcomes and not missing:
        echo(f"no dead letters in {key}: nothing to replay", err=True)
    failed = len(missing)
    moved = 0
    for outcome in outcomes:
        if outcome.to is None:
            failed += 1
            echo(f"{outcome.letter.id}  not replayed: {outcome.error}", err=True)
            continue
        origin = outcome.letter.as_json()["originalStream"]
        line = f"{outcome.letter.id}  -> {outcome.to}"
        if outcome.to.split("/", 1)[0] != origin:
            moved += 1
            line += f"  (from {origin})"
        echo(line)
    if moved:
        option = f"--key-field {key_field}" if key_field else f"--payload-key {payload_key}"
        echo(
            f"note: {moved} of {len(outcomes)} went to another shard than they came from; "
            f"expected only if the stream was resharded since, else {option} is not the key "
            "the publisher routes by and those entries now sit beside other keys' entries",
            err=True,
        )
    if failed:
        raise typer.Exit(EXIT_FAILED)


@contextlib.asynccontextmanager
async def _redis(settings: StreamKitSettings) -> AsyncIterator[AsyncRedis]:
    """The settings' Redis, checked with a PING: an unreachable one is one line."""
    from streamkit.connections import connect_redis
    from streamkit.startup import check_redis

    redis = connect_redis(settings.redis_url, cluster=settings.redis_cluster)
    try:
        await check_redis(redis, settings)
        yield redis
    finally:
        await redis.aclose()
