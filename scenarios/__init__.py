"""Package data: the scenarios bundled with edgefl (`edgefl scenarios list`, `edgefl run NAME`)."""
