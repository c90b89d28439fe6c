"""The SQLite session log (the default): the writer and its reader."""
