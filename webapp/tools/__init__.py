"""The tool API for a team's own tools: a Tool declares what the desk must know (its arguments, whether
it waits for a person by default, the money a call moves, what it acts on, the facts a reviewer
needs, a sentence for people), and the desk's core reads only that. These names are a contract:

    from webapp.tools import Tool, ToolContext, Review, Record, Fact, Concern, ToolError

Add tools with `EXTRA_TOOLS=package.module:ToolClass,...`; docs/tools.md walks through one.
"""

from webapp.tools.registry import Concern, Fact, Letter, Record, Review, Tool, ToolContext, ToolError
from webapp.tools.tasks import Task

__all__ = ["Concern", "Fact", "Letter", "Record", "Review", "Task", "Tool", "ToolContext", "ToolError"]
