"""Money: what a request costs (``costs``, the only place for cost arithmetic), spending caps
(``budgets``), per-key rate limits (``ratelimit``) and spend reports and live totals (``spend``)."""
