"""Tools that finish later, for tests. Worker subprocesses load them with EXTRA_TOOLS, like any
operator's own tool."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from webapp.tools.registry import Tool, ToolContext
from webapp.tools.tasks import CANCELLED, COMPLETED, FAILED, WORKING, Task


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Countdown(Tool):
    """Working for `polls` polls, then completed (or failed, or cancelled by itself); each poll notes
    the process that made it, so a test can see a task resumed in another process."""

    name = "countdown"
    title = "Count down"
    description = "Counts down in the background and reports the polls it took."
    cancelled: ClassVar[list[int]] = []  # tool call ids whose task this process was asked to stop

    class Input(_Input):
        polls: int = Field(3, ge=1, le=20)
        poll_seconds: float = Field(0.2, gt=0, le=5)
        ends: str = Field(COMPLETED, pattern="^(completed|failed|cancelled)$")

    def execute(self, input: Input, context: ToolContext) -> Task:  # noqa: A002
        return Task(
            WORKING,
            message=f"0 of {input.polls} polls",
            poll_seconds=input.poll_seconds,
            progress=0.0,
            data={"polls": 0, "of": input.polls, "ends": input.ends, "pids": []},
        )

    def resume(self, task: Task, context: ToolContext) -> Task:
        polls, of = task.data["polls"] + 1, task.data["of"]
        pids = [*task.data["pids"], os.getpid()]
        if polls < of:
            return replace(
                task,
                message=f"{polls} of {of} polls",
                progress=polls / of,
                data={**task.data, "polls": polls, "pids": pids},
            )
        if task.data["ends"] == FAILED:
            return Task(FAILED, message=f"The countdown broke after {polls} polls.")
        if task.data["ends"] == CANCELLED:
            return Task(CANCELLED, message="The countdown was withdrawn by its owner.")
        return Task(COMPLETED, result={"polls": polls, "pids": pids})

    def cancel(self, task: Task, context: ToolContext) -> None:
        self.cancelled.append(context.tool_call_id)


class Stuck(Tool):
    """A task that never makes progress; it gives up after half a second."""

    name = "stuck"
    title = "Get stuck"
    description = "Starts work that never progresses."
    task_time_limit_seconds = 0.5

    class Input(_Input):
        pass

    def execute(self, input: Input, context: ToolContext) -> Task:  # noqa: A002
        return Task(WORKING, message="Exported 4 of 10 tables", poll_seconds=0.1, data={"tables": 4})

    def resume(self, task: Task, context: ToolContext) -> Task:
        return task


class BadStatus(Tool):
    """A tool that answers with a task status that does not exist."""

    name = "bad_status"
    title = "Answer badly"
    description = "Returns a task with an invalid status."

    class Input(_Input):
        pass

    def execute(self, input: Input, context: ToolContext) -> Task:  # noqa: A002
        return Task("paused", message="taking a break")
