"""gpuckptd, the node service: drains GPU containers through their engines and restores them."""
