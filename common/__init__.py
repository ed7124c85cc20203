"""Utilities every stage shares: seed lists, atomic files, worker processes, task fan-out.

The bottom layer: it imports nothing from the rest of nsacdrive.
"""
