"""Listener declarations fail at decoration time with a clear message."""

from __future__ import annotations

from typing import Any

import pytest

from streamkit import ListenerConfigError, Message, StreamKit, StreamkitError


@pytest.fixture
def app() -> StreamKit:
    return StreamKit(coordinator_url="http://127.0.0.1:9", member_id_base="unit")


async def handler(msg: Message) -> None:
    await msg.ack()


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"stream_prefix": "", "group": "g"}, "stream_prefix must be a non-empty string"),
        ({"stream_prefix": "orders", "group": ""}, "group must be a non-empty string"),
        ({"stream_prefix": None, "group": "g"}, "stream_prefix must be a non-empty string"),
        ({"stream_prefix": "a{b}", "group": "g"}, "not allowed"),
        ({"stream_prefix": "orders", "group": "bill ing"}, "not allowed"),
        (
            {"stream_prefix": "o", "group": "g", "concurrency": 0},
            "concurrency must be an integer >= 1",
        ),
        ({"stream_prefix": "o", "group": "g", "concurrency": True}, "concurrency"),
        ({"stream_prefix": "o", "group": "g", "concurrency": 1.5}, "concurrency"),
        (
            {"stream_prefix": "o", "group": "g", "batch_size": 0},
            "batch_size must be an integer >= 1",
        ),
        ({"stream_prefix": "o", "group": "g", "max_in_flight": 0}, "max_in_flight"),
        ({"stream_prefix": "o", "group": "g", "block_ms": -5}, "block_ms"),
        ({"stream_prefix": "o", "group": "g", "lifecycle": object()}, "ShardLifecycle"),
    ],
)
def test_invalid_listener_settings_fail_when_decorating(
    app: StreamKit, options: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ListenerConfigError, match=fragment) as info:
        app.stream_listener(**options)(handler)
    assert isinstance(info.value, StreamkitError)
    assert app.listeners == ()


def test_non_callable_handler_is_rejected(app: StreamKit) -> None:
    decorate = app.stream_listener(stream_prefix="orders", group="billing")
    with pytest.raises(ListenerConfigError, match="must be callable"):
        decorate("not a function")  # type: ignore[type-var]


def test_one_listener_per_group_per_app(app: StreamKit) -> None:
    app.stream_listener(stream_prefix="orders", group="billing", concurrency=2)(handler)
    with pytest.raises(ListenerConfigError, match="already registered"):
        app.stream_listener(stream_prefix="orders", group="billing")(handler)
    # Another group of the same stream is fine: member ids are per group.
    app.stream_listener(stream_prefix="orders", group="audit")(handler)
    assert [lst.key for lst in app.listeners] == [("orders", "billing"), ("orders", "audit")]


def test_defaults_and_member_ids(app: StreamKit) -> None:
    returned = app.stream_listener(
        stream_prefix="orders", group="billing", concurrency=3, batch_size=25
    )(handler)
    assert returned is handler  # the decorator leaves the function alone (DI wiring needs it)
    (listener,) = app.listeners
    assert listener.options.max_in_flight == 100
    assert listener.member_ids("pod-1") == ["pod-1-m0", "pod-1-m1", "pod-1-m2"]
    with pytest.raises(ListenerConfigError, match="member_id_base"):
        listener.member_ids("pod/1")


def test_sync_handlers_are_accepted(app: StreamKit) -> None:
    def sync_handler(msg: Message) -> None:
        msg.ack()

    app.stream_listener(stream_prefix="orders", group="billing")(sync_handler)
    (listener,) = app.listeners
    adapted: object = listener.async_handler()
    assert adapted is not None and adapted is not sync_handler


def test_shard_listener_needs_a_lifecycle(app: StreamKit) -> None:
    with pytest.raises(ListenerConfigError, match="ShardLifecycle"):
        app.shard_listener(stream_prefix="orders", group="billing", lifecycle=object())  # type: ignore[arg-type]


def test_settings_overrides_are_validated() -> None:
    app = StreamKit(coordinator_url="http://coordinator:8080", member_id_base="pod-7")
    assert app.settings.coordinator_url == "http://coordinator:8080"
    assert app.settings.member_id_base == "pod-7"
    with pytest.raises(ValueError, match="USERNAME"):
        StreamKit(coordinator_username="only-a-user")
