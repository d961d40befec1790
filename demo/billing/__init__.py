"""The billing demo as one tool pack among others: a support desk's customers, invoices, refunds and
emails. `bin/demo` and the tests load it like any team's tools (`EXTRA_TOOLS=demo.billing:TOOLS`); the
desk's core knows none of it."""
