"""gpuckpt-runtimed, the resident helper that works owned verbs with its code loaded, and the way to it:
the compiled launcher (launcher.c, resident_call.c), the Python caller (call.py), the programs a worker asks the
caller to start (caller.py) and the wire both ends speak (messages.py)."""
