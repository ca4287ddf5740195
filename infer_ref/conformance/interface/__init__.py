"""What an implementation provides to be judged: the adapter protocol and the cache contract."""
