"""Crash and restart one member of a running app, as ``kill -9`` and a restart would.

Test-only: a real process never restarts one member of itself.  The restart
replaces the member inside the app's own supervision (its task group and its
lists of members), so the app drains and leaves it on shutdown like any other;
that is why this reaches into ``StreamKit``'s private state.
"""

from __future__ import annotations

import anyio

from streamkit.app import StreamKit, _run_member
from streamkit.consumer.member import new_incarnation
from streamkit.consumer.runtime import MemberRuntime

__all__ = ["crash_member", "restart_member"]


def crash_member(app: StreamKit, member: MemberRuntime) -> MemberRuntime:
    """Stop ``member`` as a killed process would: no drain, no acks, no leave."""
    if member not in app.members:
        raise RuntimeError(f"member {member.member_id} is not one of this app's members")
    member.crash()
    return member


def restart_member(app: StreamKit, killed: MemberRuntime) -> MemberRuntime:
    """Start a member in place of ``killed`` (after ``crash_member``), as a
    restarted process would: a new incarnation, so a new member id unless
    membership is static.  Returns the new member."""
    members = app._members
    if app._member_tg is None or killed not in members:
        raise RuntimeError(f"member {killed.member_id} is not one of this app's members")
    if not killed.crashed:
        raise RuntimeError(f"member {killed.member_id} is still running: crash() it first")
    index = members.index(killed)
    listener = next(
        x for x in app.listeners if x.key == (killed.stream_prefix, killed.consumer_group)
    )
    slot = killed.member_id.rsplit("-m", 1)[1]
    incarnation = new_incarnation()
    base = app.settings.member_id_prefix(incarnation)
    fresh = app._member(listener, f"{base}-m{slot}", incarnation, app._xackdel)
    members[index] = fresh
    app._finished[index] = done = anyio.Event()
    app._member_tg.start_soon(_run_member, fresh, done, name=f"streamkit-member-{slot}")
    return fresh
