"""`tools loadtest`: Locust runs gated on exact-P99 service-level objectives."""
