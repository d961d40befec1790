"""Tool packs as an outside team would write them, from docs/tools.md alone, loaded with EXTRA_TOOLS."""
