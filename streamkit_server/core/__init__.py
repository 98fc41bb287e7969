"""The coordinator protocol as pure functions over plain values (sans-IO).

Nothing in this package performs I/O or reads a clock: the server's HTTP and
Redis adapters load a ``GroupMetadata``, call these functions with ``now_ms``,
write the result with a revision CAS and answer from what was written.
"""

from .assignor import assign, moved_count
from .config import CoordinatorConfig
from .groups import (
    create_group,
    delete_group,
    group_already_exists,
    group_not_found,
    invariant_violations,
)
from .heartbeat import TooManyMembers, handle_heartbeat
from .limits import MAX_SHARD_COUNT, join_refusal
from .model import (
    LAYOUT_VERSION,
    SCHEMA_VERSION,
    CorrectionRound,
    GroupMetadata,
    MemberMetadata,
    MigrationRecord,
    ShardProgress,
    new_group,
)
from .resharding import (
    ReshardingRejected,
    ReshardingSpec,
    ReshardingWork,
    apply_drain_probe,
    apply_retirement,
    complete_provisioning,
    fail_provisioning,
    pending_work,
    rollback_resharding,
    start_resharding,
)
from .result import (
    Change,
    GroupCreated,
    GroupDeleted,
    GroupDocumentChanged,
    MemberRemoved,
    MemberUpserted,
    Result,
    WitnessSeen,
    diff,
    merge_changes,
    result_of,
    steady,
)
from .rollback import Observation, Seen, observe
from .timeouts import begin_correction, next_deadline_ms, tick

__all__ = [
    "LAYOUT_VERSION",
    "MAX_SHARD_COUNT",
    "SCHEMA_VERSION",
    "Change",
    "CoordinatorConfig",
    "CorrectionRound",
    "GroupCreated",
    "GroupDeleted",
    "GroupDocumentChanged",
    "GroupMetadata",
    "MemberMetadata",
    "MemberRemoved",
    "MemberUpserted",
    "MigrationRecord",
    "Observation",
    "ReshardingRejected",
    "ReshardingSpec",
    "ReshardingWork",
    "Result",
    "Seen",
    "ShardProgress",
    "TooManyMembers",
    "WitnessSeen",
    "apply_drain_probe",
    "apply_retirement",
    "assign",
    "begin_correction",
    "complete_provisioning",
    "create_group",
    "delete_group",
    "diff",
    "fail_provisioning",
    "group_already_exists",
    "group_not_found",
    "handle_heartbeat",
    "invariant_violations",
    "join_refusal",
    "merge_changes",
    "moved_count",
    "new_group",
    "next_deadline_ms",
    "observe",
    "pending_work",
    "result_of",
    "rollback_resharding",
    "start_resharding",
    "steady",
    "tick",
]
