"""Devices: profiles, co-running apps, networks, and the pool that deals them to clients."""
