"""The shared base for touching the host: starting programs, /proc, ptrace, named pipes and
files written as root where others may have put something."""
