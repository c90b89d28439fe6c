"""Development tools of the project (not shipped): the import contract's own type."""
