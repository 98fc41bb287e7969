"""The errors a member ends with, and which coordinator refusals become them.

A member retries what may pass (the coordinator down, a timeout, an error
after it once joined); these are the refusals that no retry fixes, raised
from ``StreamKit.serve()`` so that ``streamkit run`` fails with one line.
"""

from __future__ import annotations

from streamkit.coordinator_client import CoordinatorError
from streamkit.errors import StreamkitError

__all__ = [
    "MEMBER_ID_IN_USE",
    "AssignmentLeaseError",
    "GroupNotFoundError",
    "MemberRejectedError",
    "lease_error_message",
    "refused",
]

#: The coordinator's answer to a join for a member id another process holds.
MEMBER_ID_IN_USE = "MEMBER_ID_IN_USE"


class GroupNotFoundError(StreamkitError):
    """The coordinator does not know the stream prefix / consumer group."""

    def __init__(
        self, stream_prefix: str, consumer_group: str, coordinator_url: str, hint: str = ""
    ) -> None:
        # The hint (the stream's existing groups) comes first: a typo is likelier
        # than a group nobody created.
        super().__init__(
            f"the coordinator at {coordinator_url} has no consumer group {consumer_group!r} "
            f"on stream {stream_prefix!r}; "
            + (f"{hint} Otherwise create" if hint else "create")
            + f" it first: streamkit group create {stream_prefix} {consumer_group} (or declare"
            f" the stream in the app, app.stream({stream_prefix!r}, shards=N), to have it"
            " created at start)"
        )
        self.stream_prefix = stream_prefix
        self.consumer_group = consumer_group


class MemberRejectedError(StreamkitError):
    """The coordinator refused this member's heartbeats before it ever joined."""


class AssignmentLeaseError(StreamkitError):
    """The local assignment lease would outlive the coordinator's member lease."""


def refused(
    exc: CoordinatorError,
    *,
    member_id: str,
    stream_prefix: str,
    consumer_group: str,
    coordinator_url: str,
) -> StreamkitError:
    """What a 401, 403 or 404 to a member's first heartbeat becomes."""
    if exc.status_code == 404:
        return GroupNotFoundError(stream_prefix, consumer_group, coordinator_url)
    return MemberRejectedError(
        f"member {member_id} may not heartbeat on {stream_prefix}/{consumer_group}: {exc} "
        "(check STREAMKIT_COORDINATOR_USERNAME/_PASSWORD/_TOKEN and the MEMBER role)"
    )


def lease_error_message(member_id: str, local_ms: int, coordinator_ttl_ms: int) -> str:
    """Why a local assignment lease longer than the coordinator's member lease is unsafe."""
    return (
        f"STREAMKIT_ASSIGNMENT_LEASE_MS={local_ms} exceeds the coordinator's member lease "
        f"TTL ({coordinator_ttl_ms} ms): member {member_id} could keep reading after "
        "the coordinator hands its shards to another member; set it to at most "
        f"{coordinator_ttl_ms} or leave it unset"
    )
