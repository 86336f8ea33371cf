"""What a user must trust is written down, and the declared dependency floors are the ones the code needs."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {r.name: r for r in map(Requirement, deps)}


def test_the_docs_say_that_configs_import_paths_mcp_commands_and_resumed_run_folders_are_code():
    for page in ("extending.md", "training.md"):
        text = " ".join((ROOT / "docs" / page).read_text().split())
        for what in (r"config", r"import paths?", r"MCP (server )?commands?", r"run folders?"):
            assert re.search(rf"\*\*(Trust|What counts as code)\.\*\*[^#]*{what}", text), f"docs/{page}: {what}"
        assert "--resume" in text and re.search(r"only from people you trust", text), page


def test_dependency_floors_match_what_the_code_uses():
    reqs = _requirements()
    torch_floor = min(Version(s.version) for s in reqs["torch"].specifier if s.operator == ">=")
    assert torch_floor >= Version("2.6")  # weights_only loading and the DCP reader the checkpoints use
    mcp, installed = reqs["mcp"], Version(version("mcp"))
    assert installed in mcp.specifier, f"installed mcp {installed} is outside {mcp}"
    # the client is written against the installed major's API (mcp_types, httpx2, streamable_http_client)
    assert Version(f"{installed.major - 1}.99") not in mcp.specifier
    assert Version(f"{installed.major + 1}.0") not in mcp.specifier
    import mcp_types  # noqa: F401  (the 2.x split-out types package tools/mcp_connection.py imports)
