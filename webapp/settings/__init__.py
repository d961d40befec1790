"""A tenant admin's settings: policies and their changes, outside tools, MCP servers, notifications and
event webhooks, and the assistant; their pages, the actions the pages, the API and the command line share,
and the commands."""

from webapp.refusals import Refusal


class SettingsRefused(Refusal):
    """What a tenant admin's settings refuse: a policy, a change, a tool, a server, a channel or a webhook
    that cannot be saved or decided."""
