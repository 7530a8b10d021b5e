"""The FUSE adapter (``BundleOperations``) in process: handlers called directly, no kernel."""
