"""The demo model's tests speak to it with the billing pack's phrasebook registered, as a desk that
loads the billing pack does (importing it registers it, once, for the whole process)."""

import demo.billing.phrases  # noqa: F401 - registers the billing phrasebook
