"""The MariaDB/MySQL session log: the writer, its schema and migrations, the URL, the reader."""
