"""The coordinator's services: member heartbeats, ticks, stream and group creation and deletion.

Each mutation of a group is an ``Operation`` (``coordination.operations``)
submitted to the ``GroupExecutor``; stream-wide changes hold the stream lock.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamkit.protocol import (
    CreateGroupRequest,
    CreateStreamRequest,
    DeleteGroupRequest,
    GroupResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    HeartbeatStatus,
    StreamCreateResponse,
)
from streamkit_server.coordination import views
from streamkit_server.coordination.executor import (
    GroupExecutor,
    group_already_exists,
    group_not_found,
    now_ms,
)
from streamkit_server.coordination.gate import TerminatingGate
from streamkit_server.coordination.operations import (
    create_group_op,
    delete_group_op,
    heartbeat_op,
    tick_op,
)
from streamkit_server.core import (
    LAYOUT_VERSION,
    SCHEMA_VERSION,
    GroupMetadata,
    WitnessSeen,
)
from streamkit_server.core.streams import (
    StreamChoices,
    StreamRecord,
    common_layout,
    create_group_layout,
    record_with_group,
    record_without_group,
    refuse_existing_stream,
    synced_record,
)
from streamkit_server.errors import CoordinatorError
from streamkit_server.observability.metrics import Metrics
from streamkit_server.settings import ServerSettings
from streamkit_server.store.bulk import load_many
from streamkit_server.store.keys import GroupKeys, inside_key_prefix
from streamkit_server.store.metadata import MetadataStore
from streamkit_server.store.mutex import MutexTimeout
from streamkit_server.store.provisioning import Provisioner
from streamkit_server.store.streams import StreamLock, read_record, stream_group_names

__all__ = ["CoordinatorService"]

log = logging.getLogger("streamkit_server.service")


# -- the service -------------------------------------------------------------------


def _log_audit(record: dict[str, Any]) -> None:
    logging.getLogger("streamkit_server.audit").info(
        json.dumps(record, separators=(",", ":"), sort_keys=True)
    )


@dataclass(eq=False, repr=False)
class CoordinatorService:
    store: MetadataStore
    provisioner: Provisioner
    settings: ServerSettings
    metrics: Metrics
    gate: TerminatingGate

    def __post_init__(self) -> None:
        self.config = self.settings.coordinator_config()
        self.executor = GroupExecutor(self.store, self.settings, self.metrics)
        #: Where records for the audit trail go; the runtime points it at the
        #: audit log and, when configured, the audit stream.
        self.audit: Callable[[dict[str, Any]], None] = _log_audit

    def keys(self, stream_prefix: str, consumer_group: str) -> GroupKeys:
        return self.store.group_keys(stream_prefix, consumer_group)

    # -- member API --------------------------------------------------------------

    async def heartbeat(
        self,
        keys: GroupKeys,
        member_id: str,
        request: HeartbeatRequest,
        principal: str | None = None,
    ) -> HeartbeatResponse:
        """``principal``: the caller's name (None with the insecure member switch)."""
        started = time.perf_counter()
        seen: list[WitnessSeen] = []
        op = heartbeat_op(keys, member_id, request, self.config, self.metrics, seen, principal)
        try:
            async with self.gate.critical():
                response = await self.executor.submit(keys, op)
            if seen:
                self._witnessed(keys, seen[0])
        except MutexTimeout:
            # Not an HTTP error: the member simply heartbeats again.
            response = HeartbeatResponse(
                response_to=request.request_id,
                status=HeartbeatStatus.RETRY,
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                heartbeat_interval_ms=self.config.heartbeat_interval_ms,
                rebalance_timeout_ms=self.config.rebalance_timeout_ms,
            )
        self.metrics.heartbeats_by_status(str(response.status)).inc()
        if response.status is HeartbeatStatus.UNSUPPORTED_PROTOCOL:
            self.metrics.compatibility_failures.labels("coordination_version").inc()
        self.metrics.heartbeat_seconds.observe(time.perf_counter() - started)
        return response

    def _witnessed(self, keys: GroupKeys, seen: WitnessSeen) -> None:
        self.metrics.rollback_witnesses.labels(seen.verdict).inc()
        if not seen.ignored:
            return
        # An ignored claim changed nothing, but a member credential sent it:
        # leave a record an operator can find (a forged or confused witness).
        record = {
            "kind": "ignored-witness",
            "action": "heartbeat",
            "streamPrefix": keys.stream_prefix,
            "consumerGroup": keys.consumer_group,
            "memberId": seen.member_id[:256],
            "verdict": seen.verdict,
            "claimedVersion": seen.claimed_version,
            "storedVersion": seen.stored_version,
            "claimedEpoch": seen.claimed_epoch,
            "storedEpoch": seen.stored_epoch,
        }
        self.audit(record)

    # -- tick ----------------------------------------------------------------------

    async def tick_group(self, keys: GroupKeys) -> bool:
        changed = await self.executor.submit(keys, tick_op(self.config))
        if changed:
            self.metrics.ticks.inc()
        return changed

    # -- admin -----------------------------------------------------------------------

    def _refuse_reserved(self, stream_prefix: str) -> None:
        # The coordinator's own keys live under key_prefix: a stream there could
        # be, or overwrite, a rate-limit counter or a group's metadata.
        key_prefix = self.settings.key_prefix
        if inside_key_prefix(key_prefix, stream_prefix):
            raise CoordinatorError(
                "INVALID_STREAM_PREFIX",
                f"streamPrefix {stream_prefix!r} lies inside the coordinator's key prefix "
                f"{key_prefix!r}; choose a name that does not start with {key_prefix + ':'!r}",
            )

    async def create_stream(
        self, stream_prefix: str, request: CreateStreamRequest, choices: StreamChoices
    ) -> StreamCreateResponse:
        self._refuse_reserved(stream_prefix)
        count = request.initial_shard_count or self.settings.default_shard_count
        async with self.gate.critical(), self.stream_lock(stream_prefix):
            exists = await self.store.read_stream_record(stream_prefix) is not None
            refuse_existing_stream(stream_prefix, exists)
            layout = list(range(count))
            await self._refuse_collisions(stream_prefix, layout)
            await self.provisioner.provision(stream_prefix, layout, None)
            await self._write_stream_record(
                stream_prefix,
                StreamRecord(
                    tuple(layout), choices.ordering or "none", retention=choices.retention
                ),
                request.requested_by,
                request.reason,
            )
        return StreamCreateResponse(
            stream_prefix=stream_prefix, shard_count=count, metadata_version=1
        )

    async def create_group(
        self, keys: GroupKeys, request: CreateGroupRequest, choices: StreamChoices
    ) -> GroupResponse:
        prefix = keys.stream_prefix
        self._refuse_reserved(prefix)
        async with self.gate.critical(), self.stream_lock(prefix):
            record = await read_record(self.store, prefix)
            others = await self._stream_groups(prefix, record, exclude=keys.consumer_group)
            layout, fresh_layout = create_group_layout(
                prefix,
                record,
                others,
                request.initial_shard_count,
                self.settings.default_shard_count,
                choices.ordering,
            )
            if fresh_layout:
                await self._refuse_collisions(prefix, layout)
            if await self.store.load(keys) is not None:
                # Checked before provisioning too, so a duplicate create does
                # not touch Redis; the create CAS below is what decides.
                raise group_already_exists(keys)
            await self.provisioner.provision(prefix, layout, keys.consumer_group)
            # The record names the group before its metadata exists, so a
            # stream-wide change can never miss it (see streams.py).
            fresh = record_with_group(
                record, layout, choices.ordering, keys.consumer_group, choices.retention
            )
            if record is None:
                await self._write_stream_record(prefix, fresh, request.requested_by, request.reason)
            else:
                changed = fresh.layout_fields() if record.layout != fresh.layout else {}
                # A retention given with the create is the stream's from now on.
                own = fresh.retention_field() if choices.retention is not None else {}
                await self.store.update_stream_record(
                    prefix, {**changed, **fresh.groups_field(), **own}
                )
            self.executor.forget(keys)
            created = await self.executor.submit(keys, create_group_op(keys, layout))
            await self.store.add_to_index(keys)
        return views.group_response(created)

    async def delete_group(self, keys: GroupKeys, request: DeleteGroupRequest) -> GroupResponse:
        prefix = keys.stream_prefix
        async with self.gate.critical(), self.stream_lock(prefix):
            snapshot = await self.executor.submit(keys, delete_group_op(keys, request.force))
            record = await read_record(self.store, prefix)
            rest = record_without_group(record, keys.consumer_group)
            if rest is not None:
                await self.store.update_stream_record(prefix, rest.groups_field())
            # Under the stream lock, so a concurrent re-create of the group
            # cannot have its fresh Redis groups destroyed.
            await self.provisioner.destroy_group(
                prefix, sorted(snapshot.known_shards()), keys.consumer_group
            )
        return views.group_response(snapshot)

    async def _refuse_collisions(self, stream_prefix: str, shards: Sequence[int]) -> None:
        collisions = await self.provisioner.collisions(stream_prefix, shards)
        if collisions:
            shown = ", ".join(collisions[:5]) + (" ..." if len(collisions) > 5 else "")
            raise CoordinatorError(
                "STREAM_KEYS_EXIST",
                f"stream {stream_prefix!r} has no coordinator metadata but its shard keys "
                f"already hold data: {shown}",
            )

    async def _write_stream_record(
        self, stream_prefix: str, record: StreamRecord, requested_by: str, reason: str | None
    ) -> None:
        stamp = str(now_ms())
        created = await self.store.create_stream_record(
            stream_prefix,
            {
                **record.layout_fields(),
                **record.groups_field(),
                **record.retention_field(),
                "metadataVersion": "1",
                "schemaVersion": str(SCHEMA_VERSION),
                "layoutVersion": str(LAYOUT_VERSION),
                "createdAt": stamp,
                "updatedAt": stamp,
                "requestedBy": requested_by,
                "reason": reason or "",
            },
        )
        if not created:  # only possible if another writer ignored the stream lock
            raise CoordinatorError(
                "STREAM_ALREADY_EXISTS", f"stream {stream_prefix!r} already exists"
            )

    async def _stream_groups(
        self, stream_prefix: str, record: StreamRecord | None, exclude: str
    ) -> list[GroupMetadata]:
        names = await stream_group_names(self.store, stream_prefix, record)
        loaded = await self.load_groups(stream_prefix, (n for n in names if n != exclude))
        return list(loaded.values())

    # -- the stream-wide helpers, shared with the resharding service ------------------

    def stream_lock(self, stream_prefix: str) -> StreamLock:
        """The mutex of stream-wide changes (creation, scale, rollback, retirement)."""
        return StreamLock(
            self.store, stream_prefix, self.settings.mutex_ttl_ms, self.settings.mutex_wait_ms
        )

    async def load_groups(
        self, stream_prefix: str, names: Iterable[str]
    ) -> dict[str, GroupMetadata]:
        """The named groups of a stream as stored; a deleted group simply drops out.

        In one round trip (``store.bulk``): a create or scale reads every other
        group of its stream.
        """
        ordered = list(names)
        found = await load_many(self.store, [self.keys(stream_prefix, n) for n in ordered])
        return {
            name: loaded.group
            for name, loaded in zip(ordered, found, strict=True)
            if loaded is not None
        }

    async def sync_stream_record(
        self,
        stream_prefix: str,
        groups: Mapping[str, GroupMetadata],
        record: StreamRecord | None = None,
    ) -> None:
        """Make the stream record follow the groups' (common) layout.

        The groups are the source of truth; the record is what a group created
        later starts from, so every stream-wide change ends with this.
        """
        if common_layout(stream_prefix, groups.values()) is None:
            return
        if record is None:
            record = await read_record(self.store, stream_prefix)
        fresh = synced_record(stream_prefix, groups.values(), record)
        if fresh is None:
            return
        await self.store.update_stream_record(
            stream_prefix, {**fresh.layout_fields(), "updatedAt": str(now_ms())}, bump=True
        )

    # -- reads -----------------------------------------------------------------------

    async def read_group(self, keys: GroupKeys) -> GroupMetadata:
        loaded = await self.store.load(keys)
        if loaded is None:
            raise group_not_found(keys)
        return loaded.group

    async def list_groups(self) -> list[GroupMetadata]:
        groups = []
        for prefix, group in await self.store.indexed_groups():
            loaded = await self.store.load(self.keys(prefix, group))
            if loaded is not None:  # a vanished key is skipped, never rebuilt
                groups.append(loaded.group)
        return groups
