"""Stand-in server and trainer programs for the launcher tests, and the harness that drives them."""
