"""The engine tier: judging engines through their public generate API (see :mod:`.protocol`)."""
