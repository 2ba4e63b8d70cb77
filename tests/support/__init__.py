"""Helpers shared by the test tiers (message factories, the local stack, worker processes)."""
