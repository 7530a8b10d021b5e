"""The reader library: the tree model, the content reader, the ``Bundle`` facade, verify,
extract.
"""
