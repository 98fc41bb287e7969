"""What the coordinator reports: metrics, the metrics listener, gauges, health, the audit stream."""
