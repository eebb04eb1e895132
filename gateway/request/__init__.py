"""The request path, in the order a request meets it: ``proxy`` (the lifecycle), ``exchange`` (the one
object a request is), ``auth``, ``streaming`` (the measuring relay), ``resume`` (a cut stream goes on
elsewhere), ``dialect`` (reading upstream usage) and ``observation`` (what a request teaches)."""
