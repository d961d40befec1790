"""The RQ entry point of the periodic check of MCP servers' tools (the work: webapp/tools/mcp/, run
through webapp/runtime/work.py)."""

from __future__ import annotations

from webapp.runtime import work
from webapp.runtime.job_logs import bind_job


@bind_job
def check_servers() -> str:
    """Hold every MCP tool whose server changed it since an admin accepted it (release one changed back)."""
    return work.check_mcp_servers()
