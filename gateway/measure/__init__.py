"""Measurement: live per-backend stats from real traffic (``stats``), load signals and health scraped
from the backends (``signals``), circuit breaking (``health``) and the fleet's shared view (``fleet``)."""
