"""Building, measuring and recording; the searches live here too."""
