"""The `gpuckpt` command for people: install, doctor, inspect."""
