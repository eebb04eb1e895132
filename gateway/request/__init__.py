"""The request path, in the order a request meets it: ``proxy`` (the lifecycle), ``exchange`` (the one
object a request is), ``streaming`` (the relay, measured by ``measure/meter.py``) and ``resume`` (a cut
stream goes on elsewhere). What it shares with the layers below (the observation, the API key, the
upstream's dialect) is in ``values/``."""
