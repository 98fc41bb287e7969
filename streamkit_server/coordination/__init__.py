"""The executor that applies core's rules to Redis, the services built on it, and the tick loop."""
