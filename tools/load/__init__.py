"""The load: requests derived from the spec (``scenario``) and the engine that sends them."""
