"""Measurement: live per-backend stats from real traffic (``stats``), load signals and health scraped
from the backends (``signals``), circuit breaking (``health``), the fleet's shared view (``fleet``), and
what each stream carried (``meter``, which keeps the client's ``transcript`` for a takeover)."""
