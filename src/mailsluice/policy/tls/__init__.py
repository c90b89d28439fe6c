"""TLS policy toward the MX (pure): what a destination requires and whether a
connection meets it. ``model`` holds the vocabulary; the rest decide."""
