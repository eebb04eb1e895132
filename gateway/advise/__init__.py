"""``gateway advise``: the capacity plan. Replays the ledger's (or a synthetic) traffic through the
simulator for candidate replicas of each GPU-hour pool, paid by the hour with their boot time and the
paid API as the spill, and recommends the cheapest plan that keeps the routes' SLO.
"""
