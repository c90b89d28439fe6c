"""The PostgreSQL session log: the writer, its schema and migrations, the reader."""
