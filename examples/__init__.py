"""Example environments (importable as `examples.<module>:<Name>` from the repository root)."""
