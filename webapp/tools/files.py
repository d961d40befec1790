"""Where the files a tool makes live (EXPORT_DIR): one folder per tenant, so a name a call's result
gives can never reach another tenant's file. A tool names the file in its result (Tool.result_file);
the desk builds the path, and nothing of a request names one."""

from __future__ import annotations

from pathlib import Path


def tool_file_path(export_dir: Path, tenant_id: int, file_name: str) -> Path:
    """Where a tenant's file made by a tool lives."""
    return export_dir / str(tenant_id) / file_name
