"""Package data: the device, co-running app and network profiles bundled with edgefl (read by
edgefl.devices.catalog through importlib.resources)."""
