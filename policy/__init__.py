"""The decisions the shim consults before it acts: what a container's annotations may ask, what
a checkpoint's processes may hold, what CRIU cannot dump and which network options it needs."""
