"""``gateway simulate``: a discrete-event simulation that replays traffic through the gateway's own
decision, live stats, circuit breakers, budgets and cost model in virtual time, against backend
performance models that share their profiles with the emulators.
"""
