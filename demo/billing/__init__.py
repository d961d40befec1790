"""The billing demo as one tool pack among others: a support desk's customers, invoices, refunds and
emails. `bin/demo` and the tests load it like any team's tools (`EXTRA_TOOLS=demo.billing:TOOLS`); the
desk's core knows none of it. It holds its tools (tools.py), its tables (models.py), the export's
background work (exports.py), its words for the offline demo model (phrases.py, registered when the
pack is imported), the demo's tenants, people and records (seed.py), synthetic audit events for
benchmarks (synthetic.py), and its commands (commands.py: `seed-demo`, `outbox`, `audit generate`,
which the desk's command line registers because the pack is loaded)."""

from demo.billing import phrases  # noqa: F401 - registers the billing words with the offline demo model
from demo.billing.commands import COMMANDS
from demo.billing.tools import TOOLS

__all__ = ["COMMANDS", "TOOLS"]
