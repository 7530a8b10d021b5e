"""The packer: entry sources, the entry builder, the content writer, ``pack``."""
