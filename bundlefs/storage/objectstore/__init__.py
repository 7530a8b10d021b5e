"""Object-store reading policies that need no network: read-ahead (``readahead``) and outage
state (``outage``). ``bundlefs.storage.remote`` does the GETs and applies them.
"""
