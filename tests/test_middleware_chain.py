"""The middleware chain without Redis: order, pass-through levels left out,
inactive middlewares skipped while inactive, and a chain that changes."""

from __future__ import annotations

import anyio

from streamkit.middleware import ConsumeContext, ConsumeNext, ConsumeResult, Middleware, chain


class Tag(Middleware):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def consume(self, ctx: ConsumeContext, call_next: ConsumeNext) -> ConsumeResult:
        self.log.append(f"{self.name}>")
        result = await call_next()
        self.log.append(f"<{self.name}")
        return result


class Switch(Tag):
    on = False

    @property
    def active(self) -> bool:  # type: ignore[override]
        return self.on


class PassThrough(Middleware):
    """Overrides nothing: the chain must not give it a level."""


async def _run(middlewares: list[Middleware] | tuple[Middleware, ...], log: list[str]) -> None:
    ctx = ConsumeContext(None, "p", "g", "m")  # type: ignore[arg-type]

    async def handler() -> ConsumeResult:
        log.append("handler")
        return ConsumeResult()

    assert await chain(middlewares, "consume", ctx, handler) == ConsumeResult()


def test_order_pass_through_and_inactive_levels() -> None:
    async def main() -> None:
        log: list[str] = []
        switch = Switch("s", log)
        stack = (Tag("a", log), PassThrough(), switch, Tag("b", log))
        await _run(stack, log)
        assert log == ["a>", "b>", "handler", "<b", "<a"]
        log.clear()
        switch.on = True  # noticed on the next call, with the same (cached) list
        await _run(stack, log)
        assert log == ["a>", "s>", "b>", "handler", "<b", "<s", "<a"]
        log.clear()
        # A list that grows (app.add_middleware) is a new chain, not the cached one.
        growing: list[Middleware] = [Tag("a", log)]
        await _run(growing, log)
        growing.append(Tag("c", log))
        await _run(growing, log)
        assert log == ["a>", "handler", "<a", "a>", "c>", "handler", "<c", "<a"]
        log.clear()
        await _run((), log)
        assert log == ["handler"]

    anyio.run(main)
