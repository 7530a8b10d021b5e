"""The library through its public API: ``Bundle``, ``pack``, merge, verify, extract, export, the
integrations, and hostile, damaged and fuzzed bundles. A few tests also mount (marked ``mount``)."""
