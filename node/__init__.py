"""This node's own state: the config, where its files live, the engines gpuckpt is registered with (and
the hook entries and hooks.d files that register it), and the records of containers."""
