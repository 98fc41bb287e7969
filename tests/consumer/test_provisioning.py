"""Declared streams are created at start (``app.stream`` / ``shards=`` on a listener).

Against a real coordinator: what is missing is created with the declared
shard count and every group the app uses on the stream; apps starting at once
all succeed and create it once; an existing stream with another shard count is
logged, never resharded; credentials without ``WRITE`` get one error naming
the role, unless nothing needs creating.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import pytest

from streamkit import ListenerConfigError, Message, StreamKit
from streamkit.provisioning import ProvisioningError
from streamkit.testing import RedisTarget
from streamkit_server.auth.principals import hash_password

from .support import Admin, InProcessApp, in_process_settings

standalone = pytest.mark.parametrize("any_redis", ["standalone"], indirect=True)


async def handle(msg: Message) -> None:
    await msg.ack()


@standalone
async def test_missing_stream_and_groups_are_created(
    admin: Admin, names: tuple[str, str], caplog: Any, make_app: InProcessApp
) -> None:
    prefix, group = names
    app = make_app("prov")
    app.stream_listener(stream_prefix=prefix, group=group, shards=3)(handle)
    app.publisher(stream_prefix=prefix, group="audit")
    app.stream(prefix, groups=["reports"])
    caplog.set_level(logging.INFO, logger="streamkit.provisioning")
    try:
        await app.provision()
    finally:
        await app.close()
    for name in (group, "audit", "reports"):
        created = await admin.get_json(f"/streams/{prefix}/groups/{name}")
        assert created["shardCount"] == 3, created
    line = f"created stream '{prefix}' with 3 shards and group(s) '{group}', 'audit', 'reports'"
    assert line in caplog.text, caplog.text


@standalone
async def test_apps_starting_at_once_create_the_stream_once(
    admin: Admin, names: tuple[str, str], caplog: Any, make_app: InProcessApp
) -> None:
    prefix, group = names
    apps = [make_app("prov") for _ in range(4)]
    for app in apps:
        app.stream_listener(stream_prefix=prefix, group=group, shards=2)(handle)
    caplog.set_level(logging.INFO, logger="streamkit.provisioning")
    try:
        async with anyio.create_task_group() as tg:
            for app in apps:
                tg.start_soon(app.provision)
    finally:
        for app in apps:
            await app.close()
    assert caplog.text.count(f"created stream '{prefix}'") == 1, caplog.text
    assert (await admin.get_json(f"/streams/{prefix}/groups/{group}"))["shardCount"] == 2


@standalone
async def test_another_shard_count_is_logged_never_resharded(
    admin: Admin, names: tuple[str, str], caplog: Any, make_app: InProcessApp
) -> None:
    prefix, group = names
    await admin.create_group(prefix, group, 2)
    app = make_app("prov")
    app.stream_listener(stream_prefix=prefix, group=group, shards=8)(handle)
    caplog.set_level(logging.INFO, logger="streamkit.provisioning")
    try:
        await app.provision()
    finally:
        await app.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    message = warnings[0].getMessage()
    assert f"stream '{prefix}' has 2 shards, the app declares 8" in message
    assert f"streamkit stream scale {prefix} 8" in message
    group_now = await admin.get_json(f"/streams/{prefix}/groups/{group}")
    assert group_now["shardCount"] == 2 and group_now["activeMigration"] is None


@standalone
async def test_without_write_role_the_error_names_it(
    any_redis: RedisTarget, coordinator_factory: Any, names: tuple[str, str]
) -> None:
    prefix, group = names
    principals = [
        {"username": "app", "passwordHash": hash_password("pw"), "roles": ["READ", "MEMBER"]}
    ]
    coordinator = coordinator_factory(
        any_redis, env={"STREAMKIT_SERVER_PRINCIPALS": json.dumps(principals)}
    )
    # The app's own principal, not the admin.
    settings = in_process_settings(coordinator, any_redis, "prov")
    settings.update(coordinator_username="app", coordinator_password="pw")
    app = StreamKit(**settings)
    app.stream_listener(stream_prefix=prefix, group=group, shards=2)(handle)
    try:
        with pytest.raises(ProvisioningError) as caught:
            await app.provision()
    finally:
        await app.close()
    message = str(caught.value)
    assert "needs the WRITE role" in message and "principal 'app'" in message, message
    assert f"streamkit stream create {prefix} --shards 2" in message, message
    # Once an operator created it, the same credentials start fine.
    await Admin(coordinator).create_group(prefix, group, 2)
    again = StreamKit(**settings)
    again.stream_listener(stream_prefix=prefix, group=group, shards=2)(handle)
    try:
        await again.provision()
    finally:
        await again.close()


def test_declarations_are_checked_when_made() -> None:
    app = StreamKit()
    app.stream("orders", shards=4)
    with pytest.raises(ListenerConfigError, match="declared with 4 shards and with 8"):
        app.stream("orders", shards=8)
    with pytest.raises(ListenerConfigError, match="shards must be an integer from 1 to 4096"):
        app.stream("invoices", shards=0)
    with pytest.raises(ListenerConfigError, match="group"):
        app.stream("invoices", groups=["bad group"])
    app.stream("orders")  # no count: keeps the declared one
    (declared,) = app.declared_streams()
    assert declared.shards == 4 and declared.groups == ()
