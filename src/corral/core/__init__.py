"""I/O-free logic: what to do next, given results and the time.

Nothing in this package touches a socket, a file or the real clock, so it is
tested with a fake clock in milliseconds and shared by the sync and async
flavours unchanged.
"""
