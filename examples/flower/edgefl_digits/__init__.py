"""edgefl-digits: a Flower app whose nodes are edgefl's edge devices."""
