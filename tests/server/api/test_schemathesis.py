"""Schemathesis against our OpenAPI document, a real coordinator and real Redis:
no server error, every answer matches the schema.

Two runs share one coordinator: stateless (examples + fuzzing, 10 cases per
operation) and stateful, which follows the document's OpenAPI links
(``streamkit_server/api/links.py``: create a group, then read, heartbeat,
scale and delete that group).  About 30 s and 25 s on a loaded CI machine.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess
from streamkit_server.api import create_app
from streamkit_server.api.links import LINKS
from streamkit_server.settings import ServerSettings

_ST = Path(sys.executable).with_name("st")
_HOOKS = Path(__file__).with_name("schemathesis_hooks")
_needs_st = pytest.mark.skipif(
    not _ST.exists() and shutil.which("st") is None,
    reason="schemathesis is not installed (pip install -e '.[test]')",
)
_CHECKS = "not_a_server_error,response_schema_conformance"


@pytest.fixture(scope="module")
def coord(redis_server: RedisServer) -> Iterator[CoordinatorProcess]:
    redis_server.flushall()
    with CoordinatorProcess(redis_server.url) as proc:
        yield proc


async def _st(coord: CoordinatorProcess, cwd: Path, *args: str, hooks: str | None = None) -> str:
    env = dict(os.environ)
    if hooks is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_HOOKS), env.get("PYTHONPATH")]))
        env["SCHEMATHESIS_HOOKS"] = hooks
    proc = await asyncio.create_subprocess_exec(
        str(_ST) if _ST.exists() else "st", "run", f"{coord.url}/openapi.json",
        "--auth", f"{coord.admin_username}:{coord.admin_password}",
        "--checks", _CHECKS, "--request-timeout", "5", "--mode", "all", *args,
        # Its crash cache goes to the temporary directory, not the checkout.
        cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    return text


@_needs_st
async def test_fuzzing_finds_no_server_error_and_no_schema_mismatch(
    coord: CoordinatorProcess, tmp_path: Path
) -> None:
    text = await _st(coord, tmp_path, "--phases", "examples,fuzzing", "--max-examples", "10")
    assert "Fuzzing" in text and " passed" in text


@_needs_st
async def test_stateful_sequences_follow_the_links_without_errors(
    coord: CoordinatorProcess, tmp_path: Path
) -> None:
    text = await _st(
        coord, tmp_path, "--phases", "stateful", "--max-examples", "25", hooks="streamkit_names"
    )
    assert "Stateful" in text and " passed" in text, text[-3000:]
    covered = re.search(r"API Links:\s+(\d+) covered / (\d+) selected", text)
    assert covered is not None, text[-3000:]
    # Sequences really chained: a run that never got past a create proves little.
    assert int(covered.group(1)) >= 5, covered.group(0)


def test_every_link_names_real_operations_and_parameters() -> None:
    schema = create_app(ServerSettings(), admin_password="x", token_secret=b"x").openapi()
    operations = {
        op["operationId"]: (path, op)
        for path, item in schema["paths"].items()
        for op in item.values()
        if isinstance(op, dict)
    }
    for (source, status), links in LINKS.items():
        source_path, source_op = operations[source]
        declared = source_op["responses"][status]["links"]
        assert set(declared) == set(links), source
        for name, link in declared.items():
            _, target_op = operations[link["operationId"]]
            names = {p["name"] for p in target_op.get("parameters", []) if p["in"] == "path"}
            # Only path parameters of the target (a missing one is generated:
            # a new group on the stream just created).
            assert link["parameters"] and set(link["parameters"]) <= names, (source, name)
            for value in link["parameters"].values():
                if isinstance(value, str) and value.startswith("$request.path."):
                    assert "{" + value.removeprefix("$request.path.") + "}" in source_path
    # Links annotate responses only: the operations themselves are FastAPI's.
    assert all("links" not in op for _, op in operations.values())
