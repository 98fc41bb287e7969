"""Bring your own reader: a ShardLifecycle that reads its shards itself."""
