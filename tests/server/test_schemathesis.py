"""Schemathesis fuzzes every operation of our OpenAPI document against a real
coordinator on real Redis: no server error, every answer matches the schema.

Stateless (examples + fuzzing); the document declares no links, so there is
no stateful phase.  ~10 examples per operation keeps it around half a minute.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from streamkit.testing import RedisServer
from streamkit.testing.coordinator import CoordinatorProcess

_ST = Path(sys.executable).with_name("st")
pytestmark = pytest.mark.skipif(
    not _ST.exists() and shutil.which("st") is None,
    reason="schemathesis is not installed (pip install -e '.[test]')",
)


async def test_fuzzing_finds_no_server_error_and_no_schema_mismatch(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    redis_server.flushall()
    with CoordinatorProcess(redis_server.url) as coord:
        proc = await asyncio.create_subprocess_exec(
            str(_ST) if _ST.exists() else "st", "run", f"{coord.url}/openapi.json",
            "--auth", f"{coord.admin_username}:{coord.admin_password}",
            "--checks", "not_a_server_error,response_schema_conformance",
            "--phases", "examples,fuzzing", "--max-examples", "10",
            "--request-timeout", "5", "--mode", "all",
            # Its crash cache goes to the temporary directory, not the checkout.
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await asyncio.wait_for(proc.communicate(), 300)
        text = output.decode(errors="replace")
        assert proc.returncode == 0, text[-6000:]
        assert "Fuzzing" in text and " passed" in text
