"""The FUSE daemon and what talks to a mount: the pyfuse3 adapter, thread offload, the daemon's
lifecycle, the mount table. Importing this package imports neither pyfuse3 nor trio.
"""
