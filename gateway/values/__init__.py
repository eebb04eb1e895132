"""The values every layer shares, at the bottom of the house: what one request teaches (``observation``),
who may call what (``auth``: the API key), and how the upstream's answers read (``dialect``: usage, the
prompt's characters). They import nothing of the gateway's but ``errors``, so measure/, money/,
ledger/, policy/ and metrics/ read them without reaching up into the request path."""
