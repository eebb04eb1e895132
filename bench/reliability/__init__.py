"""``python -m bench.reliability``: the reliability suite (issue 16). Each scenario starts real processes
on loopback ports, creates its fault or load for real, and returns one or more ``Row``s; the command
prints them as one table and CI runs the short version of every row (``tests/reliability``)."""
