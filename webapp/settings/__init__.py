"""A tenant admin's settings: policies and their changes, outside tools, MCP servers, notifications and
event webhooks, and the assistant; their pages, the actions the pages, the API and the command line share,
and the commands."""
