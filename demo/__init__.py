"""What `bin/demo` runs beside the desk, as a company's own would be: the billing pack (`demo.billing`,
tools loaded with EXTRA_TOOLS like any team's) and programs that play the part of a company's own
systems (the inventory MCP server)."""
