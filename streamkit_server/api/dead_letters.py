"""Dead letters of a consumer group: list (READ) and replay one entry (WRITE).

streamkit extensions, not in the reference contract.  The rules (which
stream, how a replay is routed) are in ``streamkit_server/coordination/dead_letters.py``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from streamkit.protocol import API_PREFIX
from streamkit_server.api.audit import audited
from streamkit_server.api.bodies import ReplayDeadLetterRequest
from streamkit_server.api.deps import AUTHORIZE, Caller, group_keys, runtime
from streamkit_server.api.errors import CALLER_ERRORS, documented
from streamkit_server.api.monitoring import parse_record_id
from streamkit_server.coordination.dead_letters import MAX_PAGE
from streamkit_server.store.keys import GroupKeys

router = APIRouter(prefix=API_PREFIX, tags=["Dead letters"], dependencies=[AUTHORIZE])

Keys = Annotated[GroupKeys, Depends(group_keys)]
_GROUP = "/streams/{streamPrefix}/groups/{consumerGroup}"
_RECORD_ID = Annotated[str, Path(max_length=64)]


_COMMON = {400: "Invalid request (INVALID_REQUEST and friends).", **CALLER_ERRORS}


@router.get(
    f"/monitoring{_GROUP}/dead-letters",
    operation_id="listDeadLetters",
    responses=documented({**_COMMON, 404: "Group not found."}),
)
async def list_dead_letters(
    request: Request,
    keys: Keys,
    _p: Caller,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> JSONResponse:
    """The group's dead letters, oldest first; ``cursor`` is the last id of the previous page."""
    if cursor is not None:
        parse_record_id(cursor, "INVALID_CURSOR", "cursor")
    page = await runtime(request).dead_letters.page(keys, after=cursor, limit=limit)
    return JSONResponse(
        {
            "streamPrefix": keys.stream_prefix,
            "consumerGroup": keys.consumer_group,
            "deadLetterStream": page.stream,
            "total": page.total,
            "entries": [letter.as_json() for letter in page.letters],
            "nextCursor": page.next_cursor,
        }
    )


@router.post(
    f"{_GROUP}/dead-letters/{{deadLetterId}}/replay",
    operation_id="replayDeadLetter",
    responses=documented(
        {
            **_COMMON,
            404: "Group or dead letter not found.",
            409: "The original shard left the layout: name the partition key.",
            422: "The entry could not be published again (the reason is in the message).",
            503: "Coordinator terminating or Redis unavailable.",
        }
    ),
)
async def replay_dead_letter(
    request: Request,
    keys: Keys,
    deadLetterId: _RECORD_ID,
    body: ReplayDeadLetterRequest,
    _p: Caller,
) -> JSONResponse:
    """Publish one dead letter again (original fields only), then delete it."""
    parse_record_id(deadLetterId, "INVALID_DEAD_LETTER_ID", "deadLetterId")
    async with audited(request):
        done = await runtime(request).dead_letters.replay(
            keys, deadLetterId, key_field=body.key_field, payload_key=body.payload_key
        )
    return JSONResponse(
        {
            "id": done.letter.id,
            "originalStream": done.letter.as_json()["originalStream"],
            "streamKey": done.stream_key,
            "recordId": done.record_id,
        }
    )
