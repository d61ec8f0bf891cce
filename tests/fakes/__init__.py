"""Loopback fakes of the services impyard talks to (design.md §9)."""
