"""nsacdrive: the command line and the small utilities every stage shares (seeds, atomic files)."""

__version__ = "0.1.0"
