"""Model Context Protocol servers' tools as agent tools.

    conn, tools = await open_mcp_tools(MCPServerConfig(name="fs", command="npx", args=[...]), base_kwargs)
    obs = await tools[0]({"path": "/tmp"})       # an Observation, like every other tool
    await conn.aclose()                            # ends the session and the server process

Each MCPTool is a BaseTool (timeout, concurrency limit, retries on TransientError, accounting,
errors as observations) over a shared MCPConnection (tools/mcp_connection.py: the session, restarts
and secret scrubbing). Results are never cached: MCP tools may have side effects.
"""

from __future__ import annotations

import json
import re
from typing import Any

import mcp_types as mt

from core.log import get_logger
from tools.base import BaseTool, ToolError, ToolResult
from tools.config import MCPServerConfig
from tools.mcp_connection import MCPConnection, MCPError, _one_line, server_label

__all__ = ["MCPConnection", "MCPError", "MCPTool", "agent_tool_name", "describe_content", "open_mcp_tools",
           "server_label"]
log = get_logger(__name__)


def describe_content(blocks: list[Any]) -> str:
    """Text of MCP content blocks: text joined; images, audio and resources as one short line each."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, mt.TextContent):
            parts.append(block.text)
        elif isinstance(block, mt.ImageContent | mt.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data)} bytes base64]")
        elif isinstance(block, mt.EmbeddedResource):
            res = block.resource
            mime = f", {res.mime_type}" if res.mime_type else ""
            if isinstance(res, mt.TextResourceContents):
                parts.append(f"[resource: {res.uri}{mime}]\n{res.text}")  # embedded text is readable as is
            else:
                parts.append(f"[resource: {res.uri}{mime}, {len(res.blob)} bytes base64]")
        elif isinstance(block, mt.ResourceLink):
            mime = f", {block.mime_type}" if block.mime_type else ""
            parts.append(f"[resource link: {block.name} {block.uri}{mime}]")
        else:  # a content type newer than this code
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    return "\n".join(parts)


def agent_tool_name(name: str) -> str:
    """An MCP tool name as an agent tool name: characters other than letters, digits, '_' and '-' (MCP allows
    '.' and '/') become '_', and it starts with a letter or '_' (the model calls the tool by this name)."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    return clean if re.match(r"[A-Za-z_]", clean) else ("_" + clean)[:64]


class MCPTool(BaseTool):
    """One MCP server tool as an agent tool, with every BaseTool guarantee; never cached (side effects)."""

    def __init__(self, connection: MCPConnection, tool: mt.Tool, *, prefix: str = "", **kwargs: Any):
        super().__init__(**kwargs)
        self.connection = connection
        self.mcp_name = tool.name
        self.name = agent_tool_name(prefix + tool.name)
        self.description = tool.description or tool.title or f"{tool.name} (MCP server {connection.name})"
        self.parameters = dict(tool.input_schema or {}) or {"type": "object", "properties": {}}
        self.source = f"mcp:{connection.name}"
        """Where the tool comes from (for `hexsearch tools list`)."""

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Only an object with the required keys: the server checks its own full JSON Schema."""
        if not isinstance(args, dict):
            raise ToolError(f"arguments must be an object, got {type(args).__name__}")
        for key in self.parameters.get("required") or []:
            if args.get(key) is None:
                raise ToolError(f"missing required argument '{key}'")
        return args

    def cache_args(self, args: dict[str, Any]) -> dict[str, Any] | None:
        return None  # MCP tools may have side effects: never served from the cache

    async def run(self, args: dict[str, Any]) -> ToolResult:
        result = await self.connection.call_tool(self.mcp_name, args)
        text = describe_content(result.content)
        if result.is_error:
            raise ToolError(self.connection.scrub(_one_line(text)) or "the tool reported an error")
        if not text.strip():
            text = json.dumps(result.structured_content, ensure_ascii=False) \
                if result.structured_content is not None else "(no output)"
        data: dict[str, Any] = {"text": text}
        if result.structured_content is not None:
            data["structured"] = result.structured_content
        return ToolResult(data=data, meta={"server": self.connection.name, "mcp_tool": self.mcp_name})

    def render(self, data: Any, args: dict[str, Any]) -> str:
        return data["text"] if isinstance(data, dict) else str(data)


async def open_mcp_tools(server: MCPServerConfig, base_kwargs: dict[str, Any]) -> tuple[MCPConnection, list[MCPTool]]:
    """Start one server and wrap its tools (only `server.tools` when given); MCPError when it cannot.

    `base_kwargs` are BaseTool's keyword arguments (`tools.builtin.base_kwargs`). The caller owns the
    returned connection and must `await conn.aclose()` when done (the tools share it).
    """
    kwargs = dict(base_kwargs)
    timeout_s = float(kwargs.get("timeout_s", 30.0))
    conn = MCPConnection(server, call_timeout_s=timeout_s + 5.0,  # BaseTool's timeout fires first, with its message
                         restart_backoff_s=float(kwargs.get("backoff_initial_s", 0.5)),
                         restart_backoff_max_s=float(kwargs.get("backoff_max_s", 8.0)))
    await conn.start()
    try:
        try:
            listed = await conn.list_tools()
        except (ToolError, TimeoutError) as exc:
            why = str(exc) or f"listing its tools timed out after {server.connect_timeout_s:g}s"
            raise MCPError(f"MCP server '{conn.name}': cannot list tools: {why}") from None
        by_name = {t.name: t for t in listed}
        chosen = listed
        if server.tools:
            missing = [n for n in server.tools if n not in by_name]
            if missing:
                raise MCPError(f"MCP server '{conn.name}': no tool named {', '.join(missing)} "
                               f"(it has: {', '.join(sorted(by_name)) or 'none'})")
            chosen = [by_name[n] for n in server.tools]
        tools = [MCPTool(conn, t, prefix=server.prefix, **kwargs) for t in chosen]
    except BaseException:
        await conn.aclose()
        raise
    log.info("MCP server '%s': %d tools (%s)", conn.name, len(tools), ", ".join(t.name for t in tools))
    return conn, tools
