"""This node's own state: the config, where its files live, its signing key and trust policy,
the engines gpuckpt is registered with, and the records of suspended containers."""
