"""What `bin/demo` runs beside the desk: programs that play the part of a company's own systems."""
