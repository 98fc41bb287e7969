"""Pure pieces: views over GroupMetadata, tokens, name validation."""

from __future__ import annotations

import pytest

from streamkit.protocol import MemberState
from streamkit_server.auth.security import Authenticator, AuthError, Principal, Role, expand_roles
from streamkit_server.coordination import views
from streamkit_server.core import GroupMetadata, MemberMetadata, new_group
from streamkit_server.errors import CoordinatorError
from streamkit_server.store.provisioning import validate_consumer_group, validate_stream_prefix


def _group() -> GroupMetadata:
    group = new_group("orders", "billing", 4, now_ms=1_000)
    group.members = {
        "a": MemberMetadata(member_id="a", state=MemberState.ACTIVE),
        "b": MemberMetadata(member_id="b", state=MemberState.ACTIVE),
    }
    group.target = {0: "a", 1: "a", 2: "b", 3: "b"}
    group.owners = {0: "a", 1: "a", 2: "a"}
    return group


def test_views_of_a_rebalancing_group() -> None:
    group = _group()
    summary = views.group_response(group)
    assert summary.target_assignment_summary == {"a": 2, "b": 2}
    assert summary.current_assignment_summary == {"a": 3}
    wire = views.assignments(group).to_wire()
    assert wire["currentAssignments"] == {"a": [{"shardIndex": 0}, {"shardIndex": 1}]}
    assert wire["revokeProgress"] == {"a": [{"shardIndex": 2}]}
    assert wire["invariantViolations"] == []
    routing = views.producer_routing(group)
    assert routing.stream_key_pattern == "orders:{shardIndex}"
    assert [s.stream_key for s in routing.shards] == [f"orders:{i}" for i in range(4)]


def test_invariant_violations_are_reported() -> None:
    group = _group()
    group.owners[3] = "ghost"
    group.owners[7] = "b"
    group.members["b"] = MemberMetadata(member_id="b", state=MemberState.EXPIRED)
    problems = views.invariant_violations(group)
    assert any("unknown member 'ghost'" in p for p in problems)
    assert any("shard 7" in p and "not assignable" in p for p in problems)
    assert any("targets member 'b' which is not live" in p for p in problems)
    assert any("held by member 'b' in state EXPIRED" in p for p in problems)


def test_tokens_roundtrip_expire_and_reject_forgery() -> None:
    auth = Authenticator("admin", "pw", b"secret", 60)
    token, expires = auth.issue(Principal("svc", frozenset({Role.READ}), "basic"), now=1000)
    assert expires == 1060
    assert auth.verify(token, now=1059).roles == {Role.READ}
    with pytest.raises(AuthError, match="expired"):
        auth.verify(token, now=1060)
    body, _, sig = token.partition(".")
    with pytest.raises(AuthError, match="signature"):
        auth.verify(f"{body}x.{sig}", now=1000)
    with pytest.raises(AuthError, match="signature"):
        Authenticator("admin", "pw", b"other", 60).verify(token, now=1000)
    assert expand_roles(["ADMIN"]) == frozenset(Role)
    assert expand_roles(["MONITOR", "nonsense"]) == {Role.READ}


@pytest.mark.parametrize("name", ["", "a{b", "a}b", "a b", "a\tb", "a\x00", "a/b", "x" * 201])
def test_bad_stream_prefixes(name: str) -> None:
    with pytest.raises(CoordinatorError) as caught:
        validate_stream_prefix(name)
    assert caught.value.error_code == "INVALID_STREAM_PREFIX"


def test_names() -> None:
    assert validate_stream_prefix("create-order:v2") == "create-order:v2"
    assert validate_consumer_group("billing.v2_x") == "billing.v2_x"
    with pytest.raises(CoordinatorError):
        validate_consumer_group("a:b")


def test_audit_status_matches_the_answer_for_every_refusal() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from streamkit_server.api.errors import status_for
    from streamkit_server.coordination.gate import CoordinatorTerminating
    from streamkit_server.errors import ApiError, CoordinatorError
    from streamkit_server.store.mutex import MutexTimeout

    assert status_for(ApiError(409, "X", "conflict")) == 409
    # Below the API a refusal names only its code; the API's table picks the status.
    assert status_for(CoordinatorError("GROUP_NOT_FOUND", "gone")) == 404
    assert status_for(CoordinatorError("COORDINATOR_BUSY", "busy")) == 503
    assert status_for(CoordinatorTerminating("bye")) == 503
    assert status_for(MutexTimeout("busy")) == 503
    assert status_for(RedisConnectionError("down")) == 503
    assert status_for(RuntimeError("bug")) == 500
