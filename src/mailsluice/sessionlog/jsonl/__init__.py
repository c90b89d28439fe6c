"""The JSON-lines session log: the writer (with rotation) and its reader."""
